"""Kernel-IR transforms: kernel IR → kernel IR, each in the module named after its pass
(`insert-sync` in insert_sync.py; the attention-shaped ones in attention/), reading a typed
`Schedule` and the `Facts` the TL graph proves. The lowering driver (tlc.lowering.passes) runs them
in the pipeline's order; `tlc opt` runs them on kernel-IR text. docs/lowering.md shows how to add one.
"""
