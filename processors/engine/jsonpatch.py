"""RFC 6902 JSON Patch, applied to activity content (ACTIVITY_DELTA).

Applies to a copy and returns None when any operation does not apply, so a
bad patch leaves the activity message exactly as it was (RFC 6902 section 5:
the whole patch fails).
"""

from __future__ import annotations

import copy
from typing import Any


class _PatchError(Exception):
    pass


def _tokens(pointer: str) -> list[str]:
    if pointer == "":
        return []
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


def _index(container: list[Any], token: str, *, for_insert: bool) -> int:
    if for_insert and token == "-":
        return len(container)
    if not token.isdigit() or (token != "0" and token.startswith("0")):
        raise _PatchError("bad array index")
    index = int(token)
    if index > len(container) or (index == len(container) and not for_insert):
        raise _PatchError("array index out of range")
    return index


def _parent(document: Any, tokens: list[str]) -> Any:
    node = document
    for token in tokens[:-1]:
        if isinstance(node, dict):
            if token not in node:
                raise _PatchError("path does not exist")
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(node, token, for_insert=False)]
        else:
            raise _PatchError("path does not exist")
    return node


def _existing(document: Any, pointer: str) -> tuple[Any, Any]:
    """The container holding the value at `pointer`, and its key or index there."""
    tokens = _tokens(pointer)
    parent = _parent(document, tokens)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise _PatchError("path does not exist")
        return parent, last
    if isinstance(parent, list):
        return parent, _index(parent, last, for_insert=False)
    raise _PatchError("path does not exist")


def _get(document: Any, pointer: str) -> Any:
    if pointer == "":
        return document
    parent, key = _existing(document, pointer)
    return parent[key]


def _remove(document: Any, pointer: str) -> Any:
    if pointer == "":
        raise _PatchError("cannot remove the whole document")
    parent, key = _existing(document, pointer)
    return parent.pop(key)


def _add(document: Any, pointer: str, value: Any) -> Any:
    tokens = _tokens(pointer)
    if not tokens:
        return value
    parent = _parent(document, tokens)
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, for_insert=True), value)
    else:
        raise _PatchError("path does not exist")
    return document


def apply_patch(document: Any, operations: list[dict[str, Any]]) -> Any | None:
    """The patched copy of `document`, or None if any operation fails."""
    result = copy.deepcopy(document)
    try:
        for operation in operations:
            op, path = operation["op"], operation["path"]
            if op == "add":
                result = _add(result, path, copy.deepcopy(operation["value"]))
            elif op == "remove":
                _remove(result, path)
            elif op == "replace":
                if path:
                    _remove(result, path)
                result = _add(result, path, copy.deepcopy(operation["value"]))
            elif op == "move":
                if path.startswith(operation["from"] + "/"):
                    raise _PatchError("cannot move a value into itself")
                result = _add(result, path, _remove(result, operation["from"]))
            elif op == "copy":
                result = _add(result, path, copy.deepcopy(_get(result, operation["from"])))
            elif op == "test" and _get(result, path) != operation["value"]:
                raise _PatchError("test failed")
    except _PatchError:
        return None
    return result
