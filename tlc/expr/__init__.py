"""The one expression language of tlc: TL shapes, coordinates and loop bounds, the TL graph's
attributes and the kernel IR's index math are all trees of these nodes.

    nodes     Const, Var, BinOp, Neg, Call, Index; the operator and function tables; printing
    parse     the LALR grammar `expr.lark` and its builder (imported by tl.lark and ir.lark)
    evaluate  host evaluation under TL rules (floor, or ceil for loop bounds) or C rules (truncate)
    rewrite   free names, substitution, bottom-up rewriting, constant folding

The TL frontend accepts a subset (`+ - * / %`, `cdiv`, `min`, `max`, plain names); the lowering
to the kernel IR maps names, division and modulo (`floor_div`, `floor_mod`), it does not
translate node classes.
"""
from __future__ import annotations

from tlc.expr.evaluate import C, TL, TL_BOUND, ExprError, Rules, eval_expr, evaluate
from tlc.expr.nodes import (ARITHMETIC, BINOPS, CONSTANT_WORDS, CPP_KEYWORDS, FUNCTIONS, IDENT, NAME, BinOp,
                            Call, Const, E, Expr, ExprLike, Index, Neg, Var, call_problem, check_ident,
                            const_text, format_expr, name_problem, print_expr)
from tlc.expr.parse import ExprBuilder, parse_expr
from tlc.expr.rewrite import children, floor_divisions, fold, fold_node, free_names, rewrite, subexprs, substitute

__all__ = [
    "ARITHMETIC", "BINOPS", "C", "CONSTANT_WORDS", "CPP_KEYWORDS", "FUNCTIONS", "IDENT", "NAME", "TL", "TL_BOUND",
    "BinOp", "Call", "Const", "E", "Expr", "ExprBuilder", "ExprError", "ExprLike", "Index", "Neg", "Rules", "Var",
    "call_problem", "check_ident", "children", "const_text", "eval_expr", "evaluate", "fold", "fold_node",
    "floor_divisions", "format_expr", "free_names", "name_problem", "parse_expr", "print_expr", "rewrite", "subexprs", "substitute"]
