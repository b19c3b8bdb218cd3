"""Scalar expressions of the kernel IR: the one expression language of `tlc.expr`, re-exported
under the names the kernel IR, its evaluators, the lowering and the CuTe emitter import."""
from __future__ import annotations

from tlc.expr import (BINOPS, CPP_KEYWORDS, FUNCTIONS, IDENT, NAME, BinOp, Call, Const, E, Expr, ExprLike, Index,
                      Neg, Var, check_ident, format_expr, free_names, parse_expr, print_expr, substitute)

__all__ = ["BINOPS", "CPP_KEYWORDS", "FUNCTIONS", "IDENT", "NAME", "BinOp", "Call", "Const", "E", "Expr", "ExprLike",
           "Index", "Neg", "Var", "check_ident", "format_expr", "free_names", "parse_expr", "print_expr",
           "substitute"]
