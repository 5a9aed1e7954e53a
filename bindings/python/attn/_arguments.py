"""Names the argument at fault when a call into attn's C++ module matches none of its signatures.

nanobind answers such a call with its whole signature and the types it was given; PyTorch users
expect the argument named, as ``torch.nn.functional`` does ("argument 'num_heads' must be int, not
float"). ``named_argument_errors`` wraps a bound module function so that, only after nanobind has
refused a call, the arguments are checked against the signature nanobind records
(``__nb_signature__``) and the first one its casters would refuse is named. Where no single
argument explains the refusal, nanobind's own message stands. (Classes cannot be wrapped so:
nanobind builds an instance without looking up a replaced ``__init__``; the constructors convert
their arguments in C++, ``scalar_argument`` in bindings/python/arrays.hpp.)
"""

import collections.abc
import functools
import operator
import os

_INT_RANGE = (-(2**63), 2**64)  # int64 and uint64 parameters both: the wider bound


def _split_top_level(text):
    """``text`` split at the commas outside brackets."""
    pieces, depth, start = [], 0, 0
    for index, character in enumerate(text):
        if character in "[(":
            depth += 1
        elif character in "])":
            depth -= 1
        elif character == "," and depth == 0:
            pieces.append(text[start:index])
            start = index + 1
    pieces.append(text[start:])
    return [piece.strip() for piece in pieces if piece.strip()]


def parameters(signature):
    """(name, annotation, has_default, keyword_only) of each parameter of a nanobind signature
    such as ``def __init__(self, key_size: int, dropout: float = \\0, *, seed: int = \\1) -> None``
    (``self`` left out)."""
    inside = signature[signature.index("(") + 1: signature.rindex(")")]
    result, keyword_only = [], False
    for piece in _split_top_level(inside):
        if piece == "*":
            keyword_only = True
            continue
        if piece in ("/", "self"):
            continue
        head, _, default = piece.partition(" = ")
        name, _, annotation = head.partition(":")
        result.append((name.strip(), annotation.strip() or "object", bool(default),
                       keyword_only))
    return result


def _type_name(value):
    kind = type(value)
    if kind.__module__ == "builtins":
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"


def _accepts_one(annotation, value):
    """Whether nanobind's caster for ``annotation`` takes ``value`` (True where the annotation is
    none of the plain ones: such an argument is never the one named)."""
    if annotation == "None":
        return value is None
    if annotation == "bool":
        return value is True or value is False  # nanobind refuses numpy.bool and 0/1
    if annotation == "int":
        number = _index(value)
        return number is not None and _INT_RANGE[0] <= number < _INT_RANGE[1]
    if annotation == "float":
        return not isinstance(value, (str, bytes)) and (
            hasattr(type(value), "__float__") or hasattr(type(value), "__index__"))
    if annotation == "str":
        return isinstance(value, str)
    if annotation == "os.PathLike":
        return isinstance(value, os.PathLike)
    if annotation == _STRING_MAPPING:
        return _string_mapping_problem(value) is None
    return True


_STRING_MAPPING = "collections.abc.Mapping[str, str]"


def _string_mapping_problem(value):
    """What nanobind's Mapping[str, str] caster refuses in ``value`` (", not list", "; its value
    for key 'epoch' is int"), or None where it takes it."""
    if not isinstance(value, collections.abc.Mapping):
        return f", not {_type_name(value)}"
    for key, item in value.items():
        if not isinstance(key, str):
            return f"; its key {key!r} is {_type_name(key)}"
        if not isinstance(item, str):
            return f"; its value for key {key!r} is {_type_name(item)} (convert it with str())"
    return None


def _accepts(annotation, value):
    return any(_accepts_one(alternative, value)
               for alternative in _split_top_level(annotation.replace("|", ",")))


def _index(value):
    """``value`` as an int where it is one (``operator.index``), else None."""
    try:
        return operator.index(value)
    except TypeError:
        return None


def explain(callable_name, signature, args, kwargs):
    """The message naming what is wrong with a call of ``callable_name`` that nanobind refused,
    or None where no single argument explains it."""
    params = parameters(signature)
    positional = [p for p in params if not p[3]]
    if len(args) > len(positional):
        return (f"{callable_name}() takes at most {len(positional)} positional arguments "
                f"({len(args)} given)")
    given = {}
    for (name, *_), value in zip(positional, args):
        given[name] = value
    names = {p[0] for p in params}
    for name, value in kwargs.items():
        if name not in names:
            return f"{callable_name}() got an unexpected keyword argument '{name}'"
        if name in given:
            return f"{callable_name}() got multiple values for argument '{name}'"
        given[name] = value
    for name, annotation, has_default, _ in params:
        if name not in given:
            if not has_default:
                return f"{callable_name}() missing required argument '{name}'"
            continue
        value = given[name]
        if annotation == _STRING_MAPPING and (problem := _string_mapping_problem(value)):
            return (f"{callable_name}(): argument '{name}' must be a mapping of str to str "
                    f"({_STRING_MAPPING}){problem}")
        if not _accepts(annotation, value):
            number = _index(value)
            if "int" in _split_top_level(annotation.replace("|", ",")) and number is not None:
                return (f"{callable_name}(): argument '{name}' must be {annotation} in "
                        f"[-2**63, 2**64), got {number}")
            return (f"{callable_name}(): argument '{name}' must be {annotation}, "
                    f"not {_type_name(value)}")
    return None


def named_argument_errors(function, callable_name):
    """``function`` (nanobind's) wrapped: a TypeError from nanobind's refusal of the call is raised
    again naming the argument at fault (``explain``); everything else passes through unchanged."""
    signatures = getattr(function, "__nb_signature__", None)
    if not signatures or len(signatures) != 1:  # overloads: nanobind's list says more
        return function
    signature = signatures[0][0]

    @functools.wraps(function)
    def call(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except TypeError as error:
            if "incompatible function arguments" not in str(error):
                raise
            message = explain(callable_name, signature, args, kwargs)
            if message is None:
                raise
            raise TypeError(message) from None

    return call
