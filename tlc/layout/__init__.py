"""Thread-value layout engine on pycute: CuTe's TiledMMA / TiledCopy algebra computed in Python, so
the emitter can spell each thread's share of a tile as a flat static layout (docs/compile_time.md).

    atoms       the SM80 MMA and copy atoms' TV layouts
    tiled_mma   TiledMMA: thrfrg_A/B/C, get_layoutX_TV, partitions and fragments
    tiled_copy  TiledCopy: make_tiled_copy(_A/B/C), tidfrg_S/D, partitions, retile
    algebra     the pieces of CuTe's layout algebra pycute lacks
    cpp         layouts as C++ types and thread-index expressions
    crosscheck  the NVRTC static_assert program that checks all of it against CuTe
"""
