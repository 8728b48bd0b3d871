"""Send-API bodies checked against the OpenAPI document's request schema.

The validator is ``openapi-schema-validator`` (the schema validator behind openapi-core, in
the OpenAPI 3.0 dialect, with ECMA-262 regular expressions so ``$`` means end of string).
What a valid body means is ``gateway.core.messages``. A body is first checked by
``jsonschema-rs`` (a compiled validator, ~100x faster: the same schemas in the Draft 4 dialect
that OpenAPI 3.0's is built on), and only a body it rejects goes through
``openapi-schema-validator``, for the verdict and the wording of every error: the fast check
decides nothing alone, it spares valid bodies the slow one (tests hold it to never accepting
what the slow one rejects; it is the stricter of the two, e.g. on ``nullable``). The message
objects (``Text``, ``Image``, ``Interactive``, ``Template``, ...) are the document's, one per
type, so any request schema built from them (the send API's ``SendRequest``, a
Graph-compatible body) is checked the same way: ``RequestValidator(document, "<its schema>")``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import jsonschema_rs
from jsonschema.exceptions import ValidationError
from openapi_schema_validator import OAS30Validator

from gateway.core.enums import UnknownPolicy
from gateway.core.messages import DEFAULT_BOT, Invalid, Message

REQUEST_SCHEMA = "SendRequest"
_MAX_ERROR = 200
# Errors listed for one body. Each costs the validator its branch's errors: a 64 KiB body of
# 1 300 bad template components took 0.35 s of the HTTP worker to word them all.
MAX_ERRORS = 50
# Where a schema says which branch of its oneOf an instance means (an inlined ``discriminator``).
_TAG = "x-tag"
# A schema's own wording for a keyword that fails (e.g. "give id or link, not both").
_ERRORS = "x-errors"


class RequestValidator:
    """Validates bodies against ``components.schemas.<schema>`` of an OpenAPI document.

    The request schema is a ``oneOf`` with a ``discriminator`` on ``type``: a body whose type the
    mapping names is checked against that one variant, so its errors are about that variant
    (``text.body: at most 4096 characters``) instead of "not valid under any of the schemas".
    Nested ``oneOf`` with a discriminator (``interactive.type``, a template parameter's
    ``type``) report the errors of the branch the instance names, the same way.
    """

    def __init__(self, document: Mapping[str, Any], schema: str = REQUEST_SCHEMA) -> None:
        root = {"components": document["components"]}
        disc = root["components"]["schemas"][schema]["discriminator"]
        self._tag: str = disc["propertyName"]
        self._variants = {tag: self._validator(root, ref) for tag, ref in disc["mapping"].items()}
        self._fast = {tag: _fast(v.schema) for tag, v in self._variants.items()}

    @staticmethod
    def _validator(root: dict[str, Any], ref: str) -> OAS30Validator:
        # References inlined once here (the schemas are not recursive): resolving them on every
        # request was a third of the validation time.
        schema = _inline({"$ref": ref}, root)
        OAS30Validator.check_schema(schema)
        return OAS30Validator(schema)

    @property
    def types(self) -> tuple[str, ...]:
        return tuple(self._variants)

    def errors(self, body: Any) -> list[str]:
        """Every problem with the body, sorted; empty when it is valid."""
        if not isinstance(body, dict):
            return ["body: must be a JSON object"]
        tag = body.get(self._tag)
        fast = self._fast.get(tag) if isinstance(tag, str) else None
        if fast is not None and _accepts(fast, body):
            return []
        return self.explain(body)

    def explain(self, body: dict[str, Any]) -> list[str]:
        """``errors`` without the fast check: every problem as the OpenAPI validator words it."""
        tag = body.get(self._tag)
        variant = self._variants.get(tag) if isinstance(tag, str) else None
        if variant is None:
            # Without a known tag no variant applies: say what the tag may be, and stop there.
            return [f"{self._tag}: one of {', '.join(self._variants)}"]
        return _explain(variant, body)

    def validate(self, body: Any) -> Message:
        """The message a request body asks for, or Invalid listing every problem."""
        errors = self.errors(body)
        if errors:
            raise Invalid(errors)
        kind = body["type"]
        to = body.get("to")
        return Message(
            # With both, "to" wins, as at Meta.
            to=to.lstrip("+") if to is not None else body["recipient"],
            phone_number_id=body["phone_number_id"],
            message={"type": kind, kind: body[kind]},
            unknown_policy=UnknownPolicy(body.get("unknown_policy", UnknownPolicy.REVIEW)),
            in_reply_to=body.get("in_reply_to"),
            bot=body.get("bot", DEFAULT_BOT),
            biz_opaque_callback_data=body.get("biz_opaque_callback_data"),
        )


class BodyValidator:
    """Validates bodies against one plain schema of the document (``components.schemas.<name>``)."""

    def __init__(self, document: Mapping[str, Any], schema: str) -> None:
        inlined = _inline({"$ref": f"#/components/schemas/{schema}"}, {"components": document["components"]})
        OAS30Validator.check_schema(inlined)
        self._validator = OAS30Validator(inlined)
        self._fast = _fast(inlined)

    def errors(self, body: Any) -> list[str]:
        """Every problem with the body, sorted; empty when it is valid."""
        if not isinstance(body, dict):
            return ["body: must be a JSON object"]
        if _accepts(self._fast, body):
            return []
        return self.explain(body)

    def explain(self, body: dict[str, Any]) -> list[str]:
        """``errors`` without the fast check: every problem as the OpenAPI validator words it."""
        return _explain(self._validator, body)


def _explain(validator: OAS30Validator, body: dict[str, Any]) -> list[str]:
    found: set[str] = set()
    more = False
    # The validator finds errors lazily: past MAX_ERRORS it is not asked for the rest.
    for e in _leaves(validator.iter_errors(body)):
        if len(found) == MAX_ERRORS:
            more = True
            break
        found.add(_describe(e))
    seen = {line.split(":", 1)[0] for line in found}
    found.update(e for e in _nul_errors(body) if e.split(":", 1)[0] not in seen)
    listed = sorted(found)
    if more or len(listed) > MAX_ERRORS:
        return [*listed[:MAX_ERRORS], f"body: more than {MAX_ERRORS} errors, the first {MAX_ERRORS} listed"]
    return listed


def _fast(schema: dict[str, Any]) -> jsonschema_rs.Draft4Validator:
    """The compiled check of one inlined schema. Formats are not asserted, as the slow
    validator (given no format checker) does not assert them."""
    return jsonschema_rs.Draft4Validator(schema, validate_formats=False)


def _accepts(fast: jsonschema_rs.Draft4Validator, body: Any) -> bool:
    """The fast check passes the body, and it holds no U+0000 (which no schema rules out
    everywhere). Anything it cannot take (a value that is not JSON) counts as a rejection:
    the slow validator says what is wrong."""
    try:
        ok = fast.is_valid(body)
    except Exception:  # e.g. a lone surrogate, which a Rust string cannot hold
        return False
    return ok and next(_nul_errors(body), None) is None


def _inline(node: Any, root: Mapping[str, Any], depth: int = 0) -> Any:
    """``node`` with every local ``$ref`` (``#/a/b``) replaced by a copy of its target, and each
    ``discriminator`` replaced by ``x-tag`` (its property name): jsonschema would resolve the
    discriminator's mapping through references, and there are none left."""
    if depth > 32:
        raise ValueError("schema references nest too deep (a cycle?)")
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/"):
            target: Any = root
            for part in ref[2:].split("/"):
                target = target[part.replace("~1", "/").replace("~0", "~")]
            return _inline(target, root, depth + 1)
        out = {k: _inline(v, root, depth) for k, v in node.items() if k != "discriminator"}
        if isinstance(node.get("discriminator"), dict):
            out[_TAG] = node["discriminator"]["propertyName"]
        return out
    if isinstance(node, list):
        return [_inline(v, root, depth) for v in node]
    return node


def _leaves(errors: Iterable[ValidationError]) -> Iterator[ValidationError]:
    """The errors to report: a failed ``oneOf`` with a tag is replaced by the errors of the branch
    its instance names (or by one error on the tag when it names none)."""
    for e in errors:
        schema = e.schema if isinstance(e.schema, Mapping) else {}
        tag = schema.get(_TAG)
        if e.validator in ("oneOf", "anyOf") and isinstance(tag, str) and isinstance(e.instance, dict):
            branch = _branch(schema[e.validator], tag, e.instance.get(tag))
            if branch is None:
                yield _tag_error(e, tag, schema[e.validator])
            else:
                yield from _leaves(c for c in e.context or () if c.schema_path and c.schema_path[0] == branch)
            continue
        yield e


def _branch(branches: list[Any], tag: str, value: Any) -> int | None:
    """The index of the branch whose ``tag`` property admits ``value``."""
    if not isinstance(value, str):
        return None
    for i, b in enumerate(branches):
        if value in b.get("properties", {}).get(tag, {}).get("enum", []):
            return i
    return None


def _tag_error(e: ValidationError, tag: str, branches: list[Any]) -> ValidationError:
    names = [v for b in branches for v in b.get("properties", {}).get(tag, {}).get("enum", [])]
    err = ValidationError(
        f"one of {', '.join(names)}", validator="enum", path=[*e.absolute_path, tag], instance=None
    )
    err.schema = {"enum": names}
    return err


def _where(error: ValidationError) -> str:
    return ".".join(str(p) for p in error.absolute_path) or "body"


def _describe(error: ValidationError) -> str:
    """One line per error that never echoes a (possibly huge) value back."""
    kw, want, instance, schema = error.validator, error.validator_value, error.instance, error.schema
    where = _where(error)
    custom = schema.get(_ERRORS, {}).get(kw) if isinstance(schema, Mapping) else None
    if isinstance(custom, str):
        # "field: text" names a field of this object ("to: give to or recipient").
        field, sep, rest = custom.partition(": ")
        if sep and field.isidentifier():
            where, custom = field if where == "body" else f"{where}.{field}", rest
        text = custom
    elif kw == "type":
        text = f"must be {'an' if str(want)[0] in 'aeiou' else 'a'} {want}"
    elif kw == "pattern":
        text = f"must match {want}"
    elif kw == "maxLength":
        text = f"at most {want} characters"
    elif kw == "minLength":
        text = f"at least {want} character{'s' if want != 1 else ''}"
    elif kw == "maxItems":
        text = f"at most {want} item{'s' if want != 1 else ''}"
    elif kw == "minItems":
        text = f"at least {want} item{'s' if want != 1 else ''}"
    elif kw in ("maximum", "minimum"):
        text = f"at {'most' if kw == 'maximum' else 'least'} {want}"
    elif kw == "enum" and isinstance(want, list):
        text = f"one of {', '.join(str(v) for v in want)}"
    elif kw == "additionalProperties" and isinstance(instance, dict) and isinstance(schema, Mapping):
        extra = sorted(set(instance) - set(schema.get("properties", {})))
        text = f"unknown fields: {', '.join(e.encode('unicode_escape').decode() for e in extra)}"
    elif kw in ("oneOf", "anyOf"):
        text = "does not match any of its allowed forms"
    else:  # required: jsonschema's own words, which name a field, not a value
        text = error.message
    line = f"{where}: {text}"
    return line if len(line) <= _MAX_ERROR else line[: _MAX_ERROR - 3] + "..."


def _nul_errors(body: Any, path: str = "body") -> Iterator[str]:
    """U+0000 anywhere (key or value): PostgreSQL's text and jsonb cannot store it."""
    if isinstance(body, str):
        if "\x00" in body:
            yield f"{path}: U+0000 is not allowed"
    elif isinstance(body, dict):
        for k, v in body.items():
            child = k if path == "body" else f"{path}.{k}"
            if "\x00" in k:
                yield f"{path}: U+0000 is not allowed in field names"
            else:
                yield from _nul_errors(v, child)
    elif isinstance(body, list):
        for i, v in enumerate(body):
            yield from _nul_errors(v, f"{path}.{i}")
