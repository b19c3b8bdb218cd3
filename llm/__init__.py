"""tlc_llm: the optional LLM workflow of tlc (`tlc gen`), imported as `tlc_llm`.

An LLM writes LLM-TL in two stages (sketch, then parameters); the text enters tlc only
through `tlc.api.check_source` / `build_source`, exactly like a hand-written `.tl` file.
`tlc` never imports this package; `tlc gen` reaches `tlc_llm.cli:main` via an entry point.
"""
from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
