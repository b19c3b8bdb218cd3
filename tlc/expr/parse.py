"""Text → expression nodes with the one LALR grammar, `expr.lark`.

`ExprBuilder` turns the grammar's trees into nodes; the TL frontend and the TL-graph text parser
import the grammar's `expr` rule into their own grammars and merge this builder into their
transformers (`merge_builder`), so every text form reads expressions with the same code.
"""
from __future__ import annotations

import functools
from pathlib import Path

from lark import Lark, Transformer
from lark.exceptions import UnexpectedInput, VisitError
from lark.visitors import merge_transformers

from tlc.diagnostics import Loc, TlcError, fail
from tlc.expr.nodes import CONSTANT_WORDS, BinOp, Call, Const, Expr, Index, Neg, Var, call_problem, name_problem
from tlc.lark_errors import describe, load_grammar, visit_position

GRAMMAR_DIR = Path(__file__).parent
GRAMMAR = GRAMMAR_DIR / "expr.lark"
# A grammar imports the rules with `%import expr (expr, NAME, NUMBER, …)`: lark prefixes the rules it
# brings along (`expr__binop`), the terminals named in the import keep their names.
NAMESPACE = "expr"
# Terminal names in words, for syntax errors.
WORDS = {"NAME": "a name", "NUMBER": "a number", "EQ_OP": "'==' or '!='", "REL_OP": "'<', '<=', '>' or '>='"}
OPERATORS = frozenset({"OR", "AND", "EQ_OP", "REL_OP", "PLUS", "MINUS", "STAR", "SLASH", "PERCENT"})


def number_value(text: str) -> int | float:
    return float(text) if any(c in text for c in ".eE") else int(text)


class ExprBuilder(Transformer):
    """lark tree of `expr.lark` → nodes; a minus in front of a number folds into the constant.

    A callback that finds a problem raises `TlcError` (via `fail`); lark wraps it in a
    `VisitError` whose node carries the position (`tlc.lark_errors.visit_position`). Subclasses
    narrow the language by overriding a callback and calling `super()` (the TL frontend does).
    """

    def number(self, items):
        text = str(items[0])
        try:
            return Const(number_value(text))
        except ValueError:  # Python refuses to read integers of thousands of digits
            raise fail(f"the number {text[:12]}… has {len(text)} digits; write a smaller one") from None

    def var(self, items):
        name = str(items[0])
        if name in CONSTANT_WORDS:
            return Const(CONSTANT_WORDS[name])
        problem = name_problem(name)
        if problem:
            raise fail(problem)
        return Var(name)

    def binop(self, items):
        lhs, op, rhs = items
        return BinOp(str(op), lhs, rhs)

    def neg(self, items):
        arg = items[-1]
        if isinstance(arg, Const) and not isinstance(arg.value, bool):
            return Const(-arg.value)
        return Neg(arg)

    def call(self, items):
        fn, args = str(items[0]), tuple(items[1:])
        problem = call_problem(fn, len(args))
        if problem:
            raise fail(problem)
        return Call(fn, args)

    def index(self, items):
        base = self.var(items[:1])
        if not isinstance(base, Var):
            raise fail(f"'{items[0]}' is a constant and cannot be indexed")
        return Index(base, tuple(items[1:]))


def merge_builder(transformer: Transformer, builder: ExprBuilder | None = None) -> Transformer:
    """`transformer` extended with the callbacks for an imported `expr` rule (`expr__binop`, …)."""
    return merge_transformers(transformer, **{NAMESPACE: builder or ExprBuilder()})


@functools.lru_cache(maxsize=None)
def load_with_expr(path: Path, starts: tuple[str, ...] = ("start",), *, maybe_placeholders: bool = True) -> Lark:
    """A grammar that `%import expr (expr)`s the expression rules, as LALR with positions."""
    return Lark(path.read_text(), parser="lalr", propagate_positions=True, maybe_placeholders=maybe_placeholders,
                start=list(starts), import_paths=[GRAMMAR_DIR])


@functools.lru_cache(maxsize=4096)
def _parse(text: str) -> Expr:
    # Expressions are immutable and the kernel-IR text repeats them: parse each text once.
    return ExprBuilder().transform(load_grammar(GRAMMAR, ("expr",)).parse(text, start="expr"))


def parse_expr(text: str, at: Loc | None = None) -> Expr:
    """Infix text → `Expr`. Errors are `TlcError`s naming the column, and with `at` (where
    `text` starts in a larger text, as the kernel-IR text parser passes) the line too."""
    parser = load_grammar(GRAMMAR, ("expr",))
    try:
        return _parse(text)
    except UnexpectedInput as exc:
        message, line, col = describe(exc, text, parser, WORDS, "the end of the expression", OPERATORS)
    except VisitError as exc:
        if not isinstance(exc.orig_exc, TlcError):
            raise exc.orig_exc from None
        message = "; ".join(d.message.removeprefix("kernel IR: ") for d in exc.orig_exc.diagnostics)
        line, col = visit_position(exc)
    except RecursionError:
        message, line, col = "expression nested too deeply", 1, 1
    shown = text if len(text) <= 80 else text[:77] + "..."
    if at is None:
        raise fail(f"expression {shown!r}, column {col}: {message}") from None
    where = Loc(at.file, at.line + line - 1, (at.col if line == 1 else 1) + col - 1)
    raise fail(f"expression `{shown}`: {message}", where) from None
