"""The schema document measured before anything is built: how deep it nests and how many JSON
values it holds, in one iterative walk that stops once the budget's max_nodes is passed, so a
hostile document is refused in milliseconds and its nesting cannot overflow the stack here."""
from __future__ import annotations

from ..budget import CompileBudget


def check_document(budget: CompileBudget, doc, what: str = "the schema") -> None:
    """Refuse a JSON document (the schema, with its enum and const values) that nests deeper
    than max_depth or holds more than max_nodes values."""
    depth, nodes, complete = document_shape(doc, budget.max_nodes)
    about = "" if complete else "at least "
    budget.at_most("max_depth", depth, f"{what} nests {about}{depth} levels deep")
    budget.at_most("max_nodes", nodes, f"{what} holds {about}{nodes} JSON values")


def document_shape(doc, max_nodes: int | None = None) -> tuple[int, int, bool]:
    """(deepest nesting, number of JSON values, whether the walk saw everything) of a document
    of dicts, lists and scalars; a bare scalar is depth 1. The walk stops as soon as it has
    counted more than max_nodes values (without looking inside the last container)."""
    deepest, nodes = 0, 1
    todo = [(doc, 1)]
    while todo:
        node, depth = todo.pop()
        deepest = max(deepest, depth)
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        nodes += len(children)
        if max_nodes is not None and nodes > max_nodes:
            return deepest, nodes, False
        todo.extend((child, depth + 1) for child in children)
    return deepest, nodes, True
