"""The AG-UI 1.1 wire schema, checked strictly (reasoning.md sections 1, 2 and 9;
docs/rules.md section 13).

The `ag-ui-protocol` package's pydantic models are lenient on purpose (they
coerce, keep unknown keys and accept `null` where the wire never carries one),
so the rule book cannot be enforced with them. This module holds the schema
as a table of field specifications and one checker that walks an event once:

* a missing required field, a `null` on an optional field, a wrong type, a
  non-string where the schema names a closed set of strings, or an interrupt
  outcome with no interrupt raises `Malformed`;
* an unknown property is stripped and noted (`Findings.unknown_fields`);
* an unknown member of a discriminated union, or a string outside a closed
  set (a text message's or tool result's `role`, `REASONING_MESSAGE_START.role`,
  a tool call's `type`, a resume entry's `status`), is removed (optional key
  removed, list element dropped, required position: the containing value
  removed, once the rest of it is judged) and noted (`Findings.unknown_members`);
* an unknown string `subtype` on REASONING_ENCRYPTED_VALUE is noted
  (`Findings.unknown_subtype`): the caller removes the whole event.

Before enforcement, the compatibility boundary translates the retired shapes
the deprecation registry keeps translatable, and notes each pointer
(`Findings.retired_shapes`): a whole `null` where an older producer meant
"absent" (`rawEvent`, a tool call's `parentMessageId`, RUN_FINISHED's `outcome`
and `result`, SUBAGENT_FINISHED's `result`, a resume entry's `payload`, a media
part's `metadata`, a tool's `parameters`, the run input's `state` and
`forwardedProps`) is removed; a `binary` content part becomes the media part
that replaced it (one with neither data nor URL is an unknown member).

Opaque positions (`metadata`, `rawEvent`, `state`, `result`, CUSTOM values,
activity content, ...) are never looked inside. Most accept any JSON value
but a whole `null`; `RAW.event`, `CUSTOM.value`, `STATE_SNAPSHOT.snapshot` and
a patch operation's `value` accept `null` too. Checking mutates the decoded
dict in place (stripping, translating) and never copies it when nothing is
stripped.

Most events on the wire are flat and clean: no unknown key, no null, no
nested structure, closed-set values in their sets. For those, `CLEAN_CHECKS`
holds one compiled expression per event type, built from the same table, that
recognises them at a fraction of the walk's cost; everything it does not
recognise (a retired shape or an unknown member among them) takes
`check_model`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from typing import Any, Final

MAX_SAFE_INTEGER: Final = 2**53 - 1

EVENT_TYPES: Final = frozenset(
    {
        "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END", "TEXT_MESSAGE_CHUNK",
        "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_CHUNK",
        "TOOL_CALL_RESULT", "STATE_SNAPSHOT", "STATE_DELTA", "MESSAGES_SNAPSHOT",
        "ACTIVITY_SNAPSHOT", "ACTIVITY_DELTA", "RAW", "CUSTOM", "RUN_STARTED", "RUN_FINISHED",
        "RUN_ERROR", "STEP_STARTED", "STEP_FINISHED", "REASONING_START",
        "REASONING_MESSAGE_START", "REASONING_MESSAGE_CONTENT", "REASONING_MESSAGE_END",
        "REASONING_MESSAGE_CHUNK", "REASONING_END", "REASONING_ENCRYPTED_VALUE",
        "SUBAGENT_STARTED", "SUBAGENT_FINISHED", "SUBAGENT_ERROR",
    }
)

ENCRYPTED_VALUE_SUBTYPES: Final = frozenset({"message", "tool-call"})


class Malformed(Exception):
    """The event breaks the wire shape: the run fails with `malformed_event`.

    The message names the JSON pointer and what was wrong, never the value.
    """


class Findings:
    """What a check stripped or noticed (each entry a JSON pointer).

    Reusable: `clear()` it after acting on it, so the hot path allocates nothing.
    """

    __slots__ = ("retired_shapes", "unknown_fields", "unknown_members", "unknown_subtype")

    def __init__(self) -> None:
        self.unknown_fields: list[str] = []
        self.unknown_members: list[str] = []
        self.unknown_subtype = False
        # Retired shapes translated at the compatibility boundary: a whole null
        # removed, or a binary content part turned into a media part.
        self.retired_shapes: list[str] = []

    def clear(self) -> None:
        self.unknown_fields.clear()
        self.unknown_members.clear()
        self.unknown_subtype = False
        self.retired_shapes.clear()


# A checker validates one value at `pointer` and returns it (possibly with
# material stripped), or REMOVE when an unknown union member must be removed.
REMOVE: Final = object()
Checker = Callable[[Any, str, Findings], Any]


def escape_pointer_token(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


# --- scalar predicates ------------------------------------------------------


def _is_string(value: Any) -> bool:
    return type(value) is str


def _is_boolean(value: Any) -> bool:
    return type(value) is bool


def _is_object(value: Any) -> bool:
    return type(value) is dict


def _is_anything(value: Any) -> bool:
    return True


def _is_present(value: Any) -> bool:
    # Any JSON value except a whole null (an opaque field the schema marks
    # `"not": {"type": "null"}`); nulls inside it are values.
    return value is not None


def _is_safe_integer(value: Any) -> bool:
    # Any JSON number whose value is an integer within ±(2^53−1); never a
    # string, never a boolean (reasoning.md section 9, "Numbers").
    if type(value) is int:
        return -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER
    if type(value) is float:
        return value.is_integer() and -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER
    return False


def _is_count(value: Any) -> bool:
    return _is_safe_integer(value) and value >= 0


_JSON_POINTER = re.compile(r"^(/([^/~]|~[01])*)*$")


def _is_json_pointer(value: Any) -> bool:
    return type(value) is str and _JSON_POINTER.match(value) is not None


def _one_of(*values: str) -> Callable[[Any], bool]:
    allowed = frozenset(values)

    def accepts(value: Any) -> bool:
        return type(value) is str and value in allowed

    return accepts


# --- schema building blocks -------------------------------------------------


class Field:
    """One property: a scalar predicate or a nested checker (never both)."""

    __slots__ = ("accepts", "check", "clean", "is_string", "nullable", "required",
                 "retired_null", "what")

    def __init__(
        self,
        required: bool,
        what: str,  # readable type, for error messages
        accepts: Callable[[Any], bool] | None = None,
        check: Checker | None = None,
        nullable: bool = False,  # `null` is a value only where the field is opaque
        clean: Callable[[Any], bool] | None = None,  # see below; only with `check`
        retired_null: bool = False,  # a whole `null` is a retired shape (see below)
    ) -> None:
        assert not (retired_null and (required or nullable)), what
        self.required = required
        self.what = what
        self.accepts = accepts
        self.check = check
        self.nullable = nullable
        # An older producer sent `null` for "absent" here, and the deprecation
        # registry keeps that shape translatable: the compatibility boundary
        # removes the key and notes its pointer (`Findings.retired_shapes`)
        # instead of failing the event.
        self.retired_null = retired_null
        self.is_string = accepts is _is_string  # the common case, checked inline
        # The values the field's check returns as they are, with no findings: a
        # scalar field's own predicate; for a nested field, the simple values it
        # may take (None: every value needs the walk).
        self.clean = accepts if check is None else clean


class Model:
    __slots__ = ("fields", "name", "open", "required_count")

    def __init__(self, name: str, fields: dict[str, Field], open: bool = False) -> None:
        self.name = name
        self.fields = fields
        # Open objects (JSON Patch operations) ignore members they do not define.
        self.open = open
        self.required_count = sum(1 for spec in fields.values() if spec.required)


def _req(what: str, accepts: Callable[[Any], bool]) -> Field:
    return Field(True, what, accepts=accepts)


def _opt(what: str, accepts: Callable[[Any], bool]) -> Field:
    return Field(False, what, accepts=accepts)


STRING = _req("a string", _is_string)
OPT_STRING = _opt("a string", _is_string)
OPT_BOOLEAN = _opt("a boolean", _is_boolean)
OBJECT = _req("an object", _is_object)
OPT_OBJECT = _opt("an object", _is_object)
# Opaque and null allowed: RAW.event, CUSTOM.value, STATE_SNAPSHOT.snapshot, a
# patch operation's value.
ANY = Field(True, "any JSON", accepts=_is_anything, nullable=True)
# Opaque, but a whole null is malformed (a text part's metadata).
OPT_VALUE = _opt("any JSON but null", _is_present)
# The same where a whole null is a retired shape, removed with a finding
# (rawEvent, results, resume payloads, media part metadata, tool parameters,
# run input state and forwardedProps).
OPT_VALUE_OR_RETIRED_NULL = Field(False, "any JSON but null", accepts=_is_present,
                                  retired_null=True)
OPT_STRING_OR_RETIRED_NULL = Field(False, "a string", accepts=_is_string, retired_null=True)
OPT_COUNT = _opt("a non-negative integer", _is_count)
POINTER = _req("a JSON pointer", _is_json_pointer)


def _nested(
    required: bool, what: str, check: Checker, clean: Callable[[Any], bool] | None = None,
    retired_null: bool = False,
) -> Field:
    return Field(required, what, check=check, clean=clean, retired_null=retired_null)


def check_model(model: Model, value: Any, pointer: str, findings: Findings) -> Any:
    if type(value) is not dict:
        raise Malformed(f"{pointer or '/'} must be an object ({model.name})")
    fields = model.fields
    unknown: list[str] | None = None
    removed: list[str] | None = None
    remove_whole = False
    required_seen = 0
    for key, item in value.items():
        spec = fields.get(key)
        if spec is None:
            if not model.open:
                if unknown is None:
                    unknown = []
                unknown.append(key)
            continue
        if spec.required:
            required_seen += 1
        if item is None and not spec.nullable:
            if spec.retired_null:
                findings.retired_shapes.append(f"{pointer}/{escape_pointer_token(key)}")
                if removed is None:
                    removed = []
                removed.append(key)
                continue
            raise Malformed(f"{pointer}/{escape_pointer_token(key)} is null; omit it instead")
        if spec.is_string:
            if type(item) is not str:
                raise Malformed(
                    f"{pointer}/{escape_pointer_token(key)} must be a string"
                    f" (got {json_type_name(item)})"
                )
            continue
        if spec.accepts is not None:
            if not spec.accepts(item):
                raise Malformed(
                    f"{pointer}/{escape_pointer_token(key)} must be {spec.what}"
                    f" (got {json_type_name(item)})"
                )
            continue
        assert spec.check is not None
        checked = spec.check(item, f"{pointer}/{escape_pointer_token(key)}", findings)
        if checked is REMOVE:
            # In a required position the whole value goes, but only once the
            # rest of it is judged: an unknown member strips material from an
            # otherwise valid value, it does not excuse a malformed one (and
            # the verdict must not depend on the order of the keys).
            if spec.required:
                remove_whole = True
                continue
            if removed is None:
                removed = []
            removed.append(key)
        elif checked is not item:
            value[key] = checked
    if required_seen != model.required_count:
        missing = [k for k, s in fields.items() if s.required and k not in value]
        raise Malformed(f"{pointer or '/'} lacks required {', '.join(missing)} ({model.name})")
    if remove_whole:
        return REMOVE
    if unknown is not None:
        for key in unknown:
            findings.unknown_fields.append(f"{pointer}/{escape_pointer_token(key)}")
            del value[key]
    if removed is not None:
        for key in removed:
            del value[key]
    return value


def json_type_name(value: Any) -> str:
    if value is None:
        return "null"
    if type(value) is bool:
        return "boolean"
    if type(value) in (int, float):
        return "number"
    if type(value) is str:
        return "string"
    if type(value) is list:
        return "array"
    if type(value) is dict:
        return "object"
    return type(value).__name__


def model_checker(model: Model) -> Checker:
    def check(value: Any, pointer: str, findings: Findings) -> Any:
        return check_model(model, value, pointer, findings)

    return check


def list_checker(item: Checker | Field, min_items: int = 0) -> Checker:
    """A JSON array (of at least `min_items` elements as received); an element
    that is an unknown union member is dropped."""

    def check(value: Any, pointer: str, findings: Findings) -> Any:
        if type(value) is not list:
            raise Malformed(f"{pointer} must be an array")
        if len(value) < min_items:
            raise Malformed(f"{pointer} must have at least {min_items} element(s)")
        kept: list[Any] | None = None
        for index, element in enumerate(value):
            if isinstance(item, Field):
                if element is None or not (item.accepts and item.accepts(element)):
                    raise Malformed(f"{pointer}/{index} must be {item.what}")
                checked = element
            else:
                checked = item(element, f"{pointer}/{index}", findings)
            if checked is REMOVE:
                if kept is None:
                    kept = list(value[:index])
                continue
            if kept is not None:
                kept.append(checked)
            elif checked is not element:
                value[index] = checked
        return value if kept is None else kept

    return check


def union_checker(discriminator: str, members: dict[str, Model], what: str) -> Checker:
    """A discriminated union: an unknown discriminator string is an unknown member."""

    def check(value: Any, pointer: str, findings: Findings) -> Any:
        if type(value) is not dict:
            raise Malformed(f"{pointer} must be an object ({what})")
        tag = value.get(discriminator)
        if type(tag) is not str:
            raise Malformed(f"{pointer}/{discriminator} must be a string ({what})")
        member = members.get(tag)
        if member is None:
            findings.unknown_members.append(f"{pointer}/{discriminator}")
            return REMOVE
        return check_model(member, value, pointer, findings)

    return check


def closed_set(*values: str) -> Checker:
    """A string of a closed set (an enum or a const in the schema).

    A string outside the set is an unrecognised member, added after this
    consumer shipped: noted in `Findings.unknown_members` and removed by the
    caller's position rule (optional: the key; required: the containing value;
    in a list: the element). Anything but a string is malformed.
    """
    allowed = frozenset(values)

    def check(value: Any, pointer: str, findings: Findings) -> Any:
        if type(value) is not str:
            raise Malformed(f"{pointer} must be a string (got {json_type_name(value)})")
        if value in allowed:
            return value
        findings.unknown_members.append(pointer)
        return REMOVE

    return check


def _closed(required: bool, what: str, *values: str) -> Field:
    # Clean: a value of the set; any other value takes the walk.
    return _nested(required, what, closed_set(*values), clean=_one_of(*values))


def string_or(other: Checker, what: str) -> Checker:
    def check(value: Any, pointer: str, findings: Findings) -> Any:
        if type(value) is str:
            return value
        if type(value) is list:
            return other(value, pointer, findings)
        raise Malformed(f"{pointer} must be {what}")

    return check


def _subtype(value: Any, pointer: str, findings: Findings) -> Any:
    if type(value) is not str:
        raise Malformed(f"{pointer} must be a string")
    if value not in ENCRYPTED_VALUE_SUBTYPES:
        findings.unknown_subtype = True
    return value


# --- the clean check ------------------------------------------------------------

CleanCheck = Callable[[dict[str, Any]], bool]

# Predicates the compiled check spells out rather than calls, as source testing
# the value whose source is given. A float safe integer passes the predicate but
# not the inline test: valid, but rare on the wire, it takes the walk.
_INLINE_TESTS: Final[dict[Callable[[Any], bool], Callable[[str], str]]] = {
    _is_string: lambda value: f"type({value}) is str",
    _is_object: lambda value: f"type({value}) is dict",
    _is_boolean: lambda value: f"type({value}) is bool",
    _is_present: lambda value: f"{value} is not None",
    _is_safe_integer: lambda value: (f"(type(number := {value}) is int"
                                     f" and abs(number) <= {MAX_SAFE_INTEGER})"),
    _is_count: lambda value: (f"(type(number := {value}) is int"
                              f" and 0 <= number <= {MAX_SAFE_INTEGER})"),
}


def compile_clean_check(
    model: Model, only: Collection[str] | None = None, picked_by: str | None = None
) -> CleanCheck:
    """Whether `check_model(model, event, ...)` would return the decoded event as
    it is, with no findings, as one compiled boolean expression.

    The expression is built from the model's fields: no key outside them, every
    required field present, and each present field's value one its `clean`
    predicate accepts (spelt out inline for the common predicates).
    False only means "take the walk": a valid event with a nested structure or
    a float timestamp is not clean here, and `check_model` gives the verdict.
    Generated code runs about twice as fast as a loop over a table, and this
    runs per record.

    `only` narrows the clean events further to those whose keys are among
    these fields (a subset of the model's). `picked_by` names the field the
    caller chose the model by (an event's `type`): it must be present, and its
    value is not looked at.
    """
    compiled = _clean_terms(model, only, picked_by, ())
    if compiled is None:
        return never_clean
    source, namespace = compiled
    check: CleanCheck = _compile(f"is_clean_{model.name}", "event", source, "False", namespace)
    return check


# The value of the checked event's `bound` field when it passes, else None.
PinnedCheck = Callable[[dict[str, Any], str | None, str | None], Any]


def compile_pinned_check(
    model: Model, only: Collection[str], picked_by: str, pinned: tuple[str, str], bound: str
) -> PinnedCheck:
    """The clean check narrowed to `only`, with the two string fields `pinned`
    equal to the check's two further arguments (strings), and the field `bound`
    present: it returns that field's value when the event passes, None otherwise.

    A pinned field outside `only` is not compared (the argument is ignored):
    the event must lack it. Equality stands in for the field's own test, as
    only a string equals a string.
    """
    compiled = _clean_terms(model, only, picked_by, pinned, bound)
    if compiled is None:
        return lambda event, first, second: None
    source, namespace = compiled
    check: PinnedCheck = _compile(f"pinned_{bound}_of_{model.name}", "event, first, second",
                                  f"value if {source} else None", "None", namespace)
    return check


def _compile(name: str, parameters: str, result: str, missing: str,
             namespace: dict[str, Any]) -> Any:
    """The function `name` of `parameters` that returns the expression `result`,
    or `missing` when `result` subscripts the event for a field it lacks."""
    exec(f"def {name}({parameters}):\n"
         f"    try:\n"
         f"        return {result}\n"
         f"    except KeyError:\n"
         f"        return {missing}\n", namespace)
    function = namespace.pop(name)
    function.__doc__ = result  # what it tests, for a reader at the prompt
    return function


# Optional fields any event may carry and most lack: the count of an event's
# keys tries the others first (its own optional fields, the timestamp servers
# put on every event), and counts these only when the event has keys left over.
_RARELY_SENT: Final = frozenset({"rawEvent", "metadata", "subagentRunId"})


def _clean_terms(
    model: Model, only: Collection[str] | None, picked_by: str | None,
    pinned: tuple[str, ...], bound: str | None = None,
) -> tuple[str, dict[str, Any]] | None:
    """The source of a clean check and its namespace; None when nothing is clean.

    Each required (or pinned, or bound) field has a term of its own, which
    fails when the field is missing; the bound field's value is kept as
    `value`. A required or bound field is read by subscript, cheaper than
    `get`: when it is missing, the compiled function takes the KeyError as a
    failed check (a pinned one is only sometimes required, and an event of
    another lane often lacks it: an exception would cost more than `get`).
    The optional fields are counted instead: one lookup each, counting
    1 when the field is present with a clean value. The event has no other key
    and no unclean optional value exactly when its size is the number of
    required fields plus that count (an optional field only the walk can judge
    is never counted: an event carrying it is not clean). An open model
    ignores keys it does not define, so it gets no count; none has optional
    fields.
    """
    fields = {name: spec for name, spec in model.fields.items() if only is None or name in only}
    if any(spec.required and name not in fields for name, spec in model.fields.items()):
        return None
    arguments = dict(zip(pinned, ("first", "second"), strict=True)) if pinned else {}
    namespace: dict[str, Any] = {}
    terms: list[str] = []
    always_present = 0  # the required, pinned and bound fields, and the one picked by
    usual: list[str] = []  # the optional fields, 1 each when present and clean
    rare: list[str] = []
    for name, spec in fields.items():
        key = repr(name)
        required = spec.required or name == bound
        if name == picked_by or name in arguments or required:
            always_present += 1
        if name == picked_by:
            continue
        value = f"event[{key}]" if required else f"event.get({key})"
        if name == bound:
            value = f"(value := {value})"
        if name in arguments:
            assert spec.clean is _is_string and name != bound, name
            terms.append(f"{value} == {arguments[name]}")
        elif spec.clean is None:  # only the walk can judge a value here
            if required:
                return None
        elif spec.clean is _is_anything:
            assert name != bound, name
            (terms if required else rare if name in _RARELY_SENT else usual).append(
                f"{key} in event")
        else:
            # An absent field reads as None, which no clean value is (only an
            # opaque field may be null).
            assert not spec.clean(None), name
            if spec.clean in _INLINE_TESTS:
                test = _INLINE_TESTS[spec.clean](value)
            else:
                accepts = f"accepts_{name}"  # field names are identifiers
                namespace[accepts] = spec.clean
                test = f"{accepts}({value})"
            (terms if required else rare if name in _RARELY_SENT else usual).append(test)
    if model.open and only is None:
        assert not usual and not rare, model.name
    else:
        terms.append(_key_count(always_present, usual, rare))
    return " and ".join(terms), namespace


def _key_count(always_present: int, usual: list[str], rare: list[str]) -> str:
    """The term that the event's size is `always_present` plus its clean optional fields."""
    if not rare:
        return f"len(event) == {' + '.join([str(always_present), *(f'({t})' for t in usual)])}"
    extra = " - ".join(["len(event)", str(always_present), *(f"({t})" for t in usual)])
    return f"((extra := {extra}) == 0 or extra == {' + '.join(f'({t})' for t in rare)})"


def never_clean(event: dict[str, Any]) -> bool:
    """The clean check of a model whose events always need the walk."""
    return False


def clean_list_of(model: Model) -> Callable[[Any], bool]:
    """The clean values of an array of `model` objects (its `list_checker`)."""
    is_clean = compile_clean_check(model)

    def accepts(value: Any) -> bool:
        return type(value) is list and all(type(item) is dict and is_clean(item)
                                           for item in value)

    return accepts


# --- the AG-UI 1.1 shapes -----------------------------------------------------

_SOURCE = union_checker(
    "type",
    {
        "data": Model("DataSource", {"type": STRING, "value": STRING, "mimeType": STRING}),
        "url": Model("UrlSource", {"type": STRING, "value": STRING, "mimeType": OPT_STRING}),
        "file": Model(
            "FileSource",
            {"type": STRING, "value": STRING, "provider": OPT_STRING, "mimeType": OPT_STRING},
        ),
    },
    "a part source",
)


def _media_part(name: str) -> Model:
    return Model(
        name,
        {
            "type": STRING,
            "id": OPT_STRING,
            "source": _nested(True, "a part source", _SOURCE),
            "metadata": OPT_VALUE_OR_RETIRED_NULL,
        },
    )


_KNOWN_CONTENT_PART = union_checker(
    "type",
    {
        "text": Model(
            "TextPart", {"type": STRING, "id": OPT_STRING, "text": STRING, "metadata": OPT_VALUE}
        ),
        "image": _media_part("ImagePart"),
        "audio": _media_part("AudioPart"),
        "video": _media_part("VideoPart"),
        "document": _media_part("DocumentPart"),
    },
    "a content part",
)

# The retired 0.x input part (deprecation registry: `{ type: "binary" }`).
_BINARY_PART = Model(
    "BinaryInputContent",
    {
        "type": STRING,
        "mimeType": STRING,
        "id": OPT_STRING,
        "data": OPT_STRING,
        "url": OPT_STRING,
        "filename": OPT_STRING,
    },
)
_MEDIA_KINDS: Final = ("image", "audio", "video")


def _binary_part(value: dict[str, Any], pointer: str, findings: Findings) -> Any:
    """A binary part translated into the media part that replaced it.

    Its own shape is checked first (mimeType a string, the rest optional
    strings). The kind comes from the MIME type's top-level type (`image/`,
    `audio/`, `video/`, else `document`, compared case-insensitively); the
    source is its data (a non-empty `data`) or else its URL (a non-empty
    `url`), with the MIME type; a non-empty `filename` becomes
    `metadata.filename`; `id` is kept. A part with neither data nor URL has
    no media equivalent: an unknown member, dropped.
    """
    part = check_model(_BINARY_PART, value, pointer, findings)
    mime_type = part["mimeType"]
    if part.get("data"):
        source = {"type": "data", "value": part["data"], "mimeType": mime_type}
    elif part.get("url"):
        source = {"type": "url", "value": part["url"], "mimeType": mime_type}
    else:
        findings.unknown_members.append(f"{pointer}/type")
        return REMOVE
    top_level, slash, _ = mime_type.partition("/")
    kind = top_level.lower() if slash else ""
    media: dict[str, Any] = {"type": kind if kind in _MEDIA_KINDS else "document"}
    if "id" in part:
        media["id"] = part["id"]
    media["source"] = source
    if part.get("filename"):
        media["metadata"] = {"filename": part["filename"]}
    findings.retired_shapes.append(pointer)
    return media


def _content_part(value: Any, pointer: str, findings: Findings) -> Any:
    if type(value) is dict and value.get("type") == "binary":
        return _binary_part(value, pointer, findings)
    return _KNOWN_CONTENT_PART(value, pointer, findings)


_CONTENT_PARTS = list_checker(_content_part)
_TEXT_OR_PARTS = _nested(
    True, "a string or an array of parts", string_or(_CONTENT_PARTS, "a string or parts"),
    clean=_is_string,
)

_FUNCTION_CALL = Model("FunctionCall", {"name": STRING, "arguments": STRING})
_TOOL_CALL = Model(
    "ToolCall",
    {
        "id": STRING,
        "type": _closed(True, '"function"', "function"),
        "function": _nested(True, "a function call", model_checker(_FUNCTION_CALL)),
        "encryptedValue": OPT_STRING,
        "encryptedValueType": OPT_STRING,
        "metadata": OPT_OBJECT,
    },
)

_MESSAGE_BASE: dict[str, Field] = {
    "id": STRING,
    "role": STRING,
    "subagentRunId": OPT_STRING,
    "metadata": OPT_OBJECT,
}
# Not on activity messages, which carry no encrypted value.
_ENCRYPTED = {"encryptedValue": OPT_STRING, "encryptedValueType": OPT_STRING}
_NAMED = {"name": OPT_STRING, **_ENCRYPTED}

MESSAGE_MODELS: Final = {
    "developer": Model("DeveloperMessage", {**_MESSAGE_BASE, **_NAMED, "content": STRING}),
    "system": Model("SystemMessage", {**_MESSAGE_BASE, **_NAMED, "content": STRING}),
    "assistant": Model(
        "AssistantMessage",
        {
            **_MESSAGE_BASE,
            **_NAMED,
            "content": OPT_STRING,
            "toolCalls": _nested(False, "an array of tool calls",
                                 list_checker(model_checker(_TOOL_CALL))),
        },
    ),
    "user": Model("UserMessage", {**_MESSAGE_BASE, **_NAMED, "content": _TEXT_OR_PARTS}),
    "tool": Model(
        "ToolMessage",
        {
            **_MESSAGE_BASE,
            **_ENCRYPTED,
            "content": _TEXT_OR_PARTS,
            "toolCallId": STRING,
            "error": OPT_STRING,
        },
    ),
    "activity": Model(
        "ActivityMessage", {**_MESSAGE_BASE, "activityType": STRING, "content": OBJECT}
    ),
    "reasoning": Model("ReasoningMessage", {**_MESSAGE_BASE, **_ENCRYPTED, "content": STRING}),
}
_MESSAGES = list_checker(union_checker("role", MESSAGE_MODELS, "a message"))

_PATCH = list_checker(
    union_checker(
        "op",
        {
            "add": Model("AddOperation", {"op": STRING, "path": POINTER, "value": ANY}, open=True),
            "remove": Model("RemoveOperation", {"op": STRING, "path": POINTER}, open=True),
            "replace": Model(
                "ReplaceOperation", {"op": STRING, "path": POINTER, "value": ANY}, open=True
            ),
            "move": Model(
                "MoveOperation", {"op": STRING, "from": POINTER, "path": POINTER}, open=True
            ),
            "copy": Model(
                "CopyOperation", {"op": STRING, "from": POINTER, "path": POINTER}, open=True
            ),
            "test": Model(
                "TestOperation", {"op": STRING, "path": POINTER, "value": ANY}, open=True
            ),
        },
        "a JSON Patch operation",
    )
)

_TOKEN_USAGE = Model(
    "TokenUsage",
    {
        "provider": OPT_STRING,
        "model": OPT_STRING,
        "inputTokens": OPT_COUNT,
        "outputTokens": OPT_COUNT,
        "totalTokens": OPT_COUNT,
        "reasoningTokens": OPT_COUNT,
        "cachedInputTokens": OPT_COUNT,
        "cacheWriteInputTokens": OPT_COUNT,
    },
)
_USAGE = _nested(False, "an array of token usage", list_checker(model_checker(_TOKEN_USAGE)),
                 clean=clean_list_of(_TOKEN_USAGE))

_INTERRUPT = Model(
    "Interrupt",
    {
        "id": STRING,
        "reason": STRING,
        "message": OPT_STRING,
        "toolCallId": OPT_STRING,
        "responseSchema": OPT_OBJECT,
        "expiresAt": OPT_STRING,
        "metadata": OPT_OBJECT,
        "subagentRunId": OPT_STRING,
    },
)
_STRINGS = list_checker(STRING)

_RUN_FINISHED_OUTCOME = union_checker(
    "type",
    {
        "success": Model(
            "RunFinishedSuccessOutcome",
            {"type": STRING, "pendingToolCallIds": _nested(False, "an array of strings", _STRINGS)},
        ),
        "interrupt": Model(
            "RunFinishedInterruptOutcome",
            {
                "type": STRING,
                "interrupts": _nested(True, "an array of interrupts",
                                      list_checker(model_checker(_INTERRUPT), min_items=1)),
            },
        ),
        "cancelled": Model("RunFinishedCancelledOutcome", {"type": STRING}),
    },
    "a run outcome",
)
_SUBAGENT_OUTCOME = union_checker(
    "type",
    {
        "success": Model("SubagentFinishedSuccessOutcome", {"type": STRING}),
        "suspended": Model(
            "SubagentFinishedSuspendedOutcome",
            {"type": STRING, "interruptIds": _nested(False, "an array of strings", _STRINGS)},
        ),
    },
    "a subagent outcome",
)

_RUN_AGENT_INPUT = Model(
    "RunAgentInput",
    {
        "threadId": STRING,
        "runId": STRING,
        "protocolVersion": OPT_STRING,
        "parentRunId": OPT_STRING,
        "state": OPT_VALUE_OR_RETIRED_NULL,
        "messages": _nested(True, "an array of messages", _MESSAGES),
        "tools": _nested(
            False,
            "an array of tools",
            list_checker(
                model_checker(
                    Model(
                        "Tool",
                        {
                            "name": STRING,
                            "description": STRING,
                            "parameters": OPT_VALUE_OR_RETIRED_NULL,
                            "metadata": OPT_OBJECT,
                        },
                    )
                )
            ),
        ),
        "context": _nested(
            False,
            "an array of context entries",
            list_checker(
                model_checker(Model("Context", {"description": STRING, "value": STRING}))
            ),
        ),
        "forwardedProps": OPT_VALUE_OR_RETIRED_NULL,
        "resume": _nested(
            False,
            "an array of resume entries",
            list_checker(
                model_checker(
                    Model(
                        "ResumeEntry",
                        {
                            "interruptId": STRING,
                            "status": _closed(True, '"resolved" or "cancelled"',
                                              "resolved", "cancelled"),
                            "payload": OPT_VALUE_OR_RETIRED_NULL,
                            "metadata": OPT_OBJECT,
                        },
                    )
                )
            ),
        ),
    },
)

_BASE: dict[str, Field] = {
    "type": STRING,
    "timestamp": _opt("an integer", _is_safe_integer),
    "rawEvent": OPT_VALUE_OR_RETIRED_NULL,
    "metadata": OPT_OBJECT,
}
_ATTRIBUTABLE: dict[str, Field] = {**_BASE, "subagentRunId": OPT_STRING}
TEXT_MESSAGE_ROLES: Final = frozenset({"developer", "system", "assistant", "user"})
_TEXT_ROLE = _closed(False, "a text message role", *sorted(TEXT_MESSAGE_ROLES))


def _event(model_name: str, base: dict[str, Field], /, **fields: Field) -> Model:
    return Model(model_name, {**base, **fields})


EVENT_MODELS: Final[dict[str, Model]] = {
    "TEXT_MESSAGE_START": _event(
        "TextMessageStartEvent", _ATTRIBUTABLE, messageId=STRING,
        role=_TEXT_ROLE, name=OPT_STRING,
    ),
    "TEXT_MESSAGE_CONTENT": _event(
        "TextMessageContentEvent", _ATTRIBUTABLE, messageId=STRING, delta=STRING
    ),
    "TEXT_MESSAGE_END": _event("TextMessageEndEvent", _ATTRIBUTABLE, messageId=STRING),
    "TEXT_MESSAGE_CHUNK": _event(
        "TextMessageChunkEvent", _ATTRIBUTABLE, messageId=OPT_STRING,
        role=_TEXT_ROLE, delta=OPT_STRING, name=OPT_STRING,
    ),
    "TOOL_CALL_START": _event(
        "ToolCallStartEvent", _ATTRIBUTABLE, toolCallId=STRING, toolCallName=STRING,
        parentMessageId=OPT_STRING_OR_RETIRED_NULL,
    ),
    "TOOL_CALL_ARGS": _event("ToolCallArgsEvent", _ATTRIBUTABLE, toolCallId=STRING, delta=STRING),
    "TOOL_CALL_END": _event("ToolCallEndEvent", _ATTRIBUTABLE, toolCallId=STRING),
    "TOOL_CALL_CHUNK": _event(
        "ToolCallChunkEvent", _ATTRIBUTABLE, toolCallId=OPT_STRING, toolCallName=OPT_STRING,
        parentMessageId=OPT_STRING_OR_RETIRED_NULL, delta=OPT_STRING,
    ),
    "TOOL_CALL_RESULT": _event(
        "ToolCallResultEvent", _ATTRIBUTABLE, messageId=STRING, toolCallId=STRING,
        content=_TEXT_OR_PARTS, role=_closed(False, '"tool"', "tool"),
    ),
    "STATE_SNAPSHOT": _event("StateSnapshotEvent", _ATTRIBUTABLE, snapshot=ANY),
    "STATE_DELTA": _event(
        "StateDeltaEvent", _ATTRIBUTABLE, delta=_nested(True, "a JSON Patch", _PATCH)
    ),
    "MESSAGES_SNAPSHOT": _event(
        "MessagesSnapshotEvent", _BASE, messages=_nested(True, "an array of messages", _MESSAGES)
    ),
    "ACTIVITY_SNAPSHOT": _event(
        "ActivitySnapshotEvent", _ATTRIBUTABLE, messageId=STRING, activityType=STRING,
        content=OBJECT, replace=OPT_BOOLEAN,
    ),
    "ACTIVITY_DELTA": _event(
        "ActivityDeltaEvent", _ATTRIBUTABLE, messageId=STRING, activityType=STRING,
        patch=_nested(True, "a JSON Patch", _PATCH),
    ),
    "RAW": _event("RawEvent", _ATTRIBUTABLE, event=ANY, source=OPT_STRING),
    "CUSTOM": _event("CustomEvent", _ATTRIBUTABLE, name=STRING, value=ANY),
    "RUN_STARTED": _event(
        "RunStartedEvent", _BASE, threadId=STRING, runId=STRING, protocolVersion=OPT_STRING,
        parentRunId=OPT_STRING,
        input=_nested(False, "a run input", model_checker(_RUN_AGENT_INPUT)),
    ),
    "RUN_FINISHED": _event(
        "RunFinishedEvent", _BASE, threadId=STRING, runId=STRING,
        result=OPT_VALUE_OR_RETIRED_NULL,
        outcome=_nested(False, "a run outcome", _RUN_FINISHED_OUTCOME, retired_null=True),
        usage=_USAGE,
    ),
    "RUN_ERROR": _event("RunErrorEvent", _BASE, message=STRING, code=OPT_STRING, usage=_USAGE),
    "STEP_STARTED": _event("StepStartedEvent", _ATTRIBUTABLE, stepName=STRING),
    "STEP_FINISHED": _event("StepFinishedEvent", _ATTRIBUTABLE, stepName=STRING),
    "REASONING_START": _event("ReasoningStartEvent", _ATTRIBUTABLE, messageId=STRING),
    "REASONING_MESSAGE_START": _event(
        "ReasoningMessageStartEvent", _ATTRIBUTABLE, messageId=STRING,
        role=_closed(True, '"reasoning"', "reasoning"),
    ),
    "REASONING_MESSAGE_CONTENT": _event(
        "ReasoningMessageContentEvent", _ATTRIBUTABLE, messageId=STRING, delta=STRING
    ),
    "REASONING_MESSAGE_END": _event("ReasoningMessageEndEvent", _ATTRIBUTABLE, messageId=STRING),
    "REASONING_MESSAGE_CHUNK": _event(
        "ReasoningMessageChunkEvent", _ATTRIBUTABLE, messageId=OPT_STRING, delta=OPT_STRING
    ),
    "REASONING_END": _event("ReasoningEndEvent", _ATTRIBUTABLE, messageId=STRING),
    "REASONING_ENCRYPTED_VALUE": _event(
        "ReasoningEncryptedValueEvent", _ATTRIBUTABLE,
        subtype=_nested(True, "a string", _subtype, clean=_one_of(*ENCRYPTED_VALUE_SUBTYPES)),
        entityId=STRING, encryptedValue=STRING, encryptedValueType=OPT_STRING,
    ),
    "SUBAGENT_STARTED": _event(
        "SubagentStartedEvent", _BASE, subagentRunId=STRING, name=STRING,
        description=OPT_STRING, parentSubagentRunId=OPT_STRING, parentToolCallId=OPT_STRING,
        parentMessageId=OPT_STRING,
    ),
    "SUBAGENT_FINISHED": _event(
        "SubagentFinishedEvent", _BASE, subagentRunId=STRING, result=OPT_VALUE_OR_RETIRED_NULL,
        outcome=_nested(False, "a subagent outcome", _SUBAGENT_OUTCOME),
    ),
    "SUBAGENT_ERROR": _event(
        "SubagentErrorEvent", _BASE, subagentRunId=STRING, message=STRING, code=OPT_STRING
    ),
}
assert set(EVENT_MODELS) == EVENT_TYPES


# Per event type, its compiled clean check.
CLEAN_CHECKS: Final = {
    event_type: compile_clean_check(model, picked_by="type")
    for event_type, model in EVENT_MODELS.items()
}


_VERSION = re.compile(r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$")
SUPPORTED_PROTOCOL: Final = (1, 1)


def protocol_version_is_foreign(version: str) -> bool:
    """True for a declaration newer than 1.1 or not of the MAJOR.MINOR grammar."""
    if version == "1.1" or version == "1.0":
        return False  # the usual declarations: no need for the regex
    match = _VERSION.match(version)
    if match is None:
        return True
    return (int(match.group(1)), int(match.group(2))) > SUPPORTED_PROTOCOL
