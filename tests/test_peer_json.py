"""The one decoder of peer JSON (rayscope.net.peer_json): its depth measure against a walk
character by character, its bound, and every way decoding fails as one exception.

Positive control: drop the ``replace(b'""', b"")`` and the split on quotes from
``peer_json.depth`` and :func:`test_depth_is_the_walks_on_json_python_writes` fails (brackets
inside strings counted).
"""

import json
import random
import time
from typing import Optional

import msgspec
import pytest

from rayscope.net import peer_json
from rayscope.net.peer_json import MAX_DEPTH, PeerJsonError, depth


def walk(text: bytes) -> int:
    """The nesting a decoder enters, one character at a time: JSON's strings and escapes, and
    it stops where a decoder would (a backslash outside a string or before what JSON does not
    escape, a close too many)."""
    level = deepest = 0
    inside = escaped = False
    for byte in text:
        char = chr(byte)
        if inside and escaped and char not in '"\\/bfnrtu':
            return deepest
        if inside:
            inside = escaped or char != '"'
            escaped = not escaped and char == "\\"
        elif char == '"':
            inside = True
        elif char in "[{":
            level += 1
            deepest = max(deepest, level)
        elif char in "]}":
            level -= 1
            if level < 0:
                return deepest
        elif char == "\\":
            return deepest
    return deepest


def document(rng: random.Random, levels: int) -> object:
    """Nested lists and objects whose strings hold brackets, quotes and backslashes."""
    if levels == 0 or rng.random() < 0.25:
        return rng.choice([1, "x[", '"\\', ']\\"{', None, "", "\\\\"])
    if rng.random() < 0.5:
        return [document(rng, levels - 1) for _ in range(rng.randint(0, 3))]
    return {
        rng.choice(["a", "[", '\\"', "}"]) + str(i): document(rng, levels - 1)
        for i in range(rng.randint(0, 3))
    }


@pytest.mark.parametrize(
    ("text", "levels"),
    [
        (b"1", 0),
        (b'"[[["', 0),
        (b"[]", 1),
        (b'{"a": [1, {"b": []}]}', 4),
        (b'["\\"[[["]', 1),
        (b'["\\\\", [[]]]', 3),
        (b"[1, [2, [3]], [4]]", 3),
        (b"[[[", 3),
        (b"]]][[", 0),
    ],
)
def test_depth(text: bytes, levels: int) -> None:
    assert depth(text) == levels
    assert depth(text.decode()) == levels


def test_depth_is_the_walks_on_json_python_writes() -> None:
    rng = random.Random(7)
    for _ in range(3000):
        text = json.dumps(document(rng, rng.randint(0, 14))).encode()
        assert depth(text) == walk(text), text


def test_depth_is_never_below_the_walks_on_any_bytes() -> None:
    """An upper bound where the text is no JSON: the decoder never goes deeper than measured."""
    rng = random.Random(11)
    for _ in range(20_000):
        text = bytes(rng.choice(b'[]{}"\\an') for _ in range(rng.randint(0, 30)))
        assert depth(text) >= walk(text), text


def test_the_bound_is_max_depth_and_the_reason_one_line() -> None:
    peer_json.check_depth(b"[" * MAX_DEPTH + b"]" * MAX_DEPTH)
    assert peer_json.decode(b"[" * MAX_DEPTH + b"]" * MAX_DEPTH)
    with pytest.raises(PeerJsonError) as raised:
        peer_json.decode(b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1))
    assert str(raised.value) == f"JSON nested 65 levels deep, over the {MAX_DEPTH} decoded"
    with pytest.raises(PeerJsonError):
        peer_json.loads("[" * 100_000)  # never closed: a decoder would go all the way down


class Shape(msgspec.Struct):
    name: str
    count: int = 0


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (b'{"name": "a", "count": "x"}', "Expected `int`, got `str` - at `$.count`"),
        (b'{"name": "\xff"}', "'utf-8' codec can't decode byte 0xff"),
        (b'{"name": ', "Input data was truncated"),
        (b"", "Input data was truncated"),
        (b'{"name": "a", "x": ' + b"{" * 1000 + b"}" * 1000 + b"}", "nested 1001 levels deep"),
        (b'{"name": "\x1b[2J"}', "JSON is malformed: invalid character"),
    ],
)
def test_every_failure_is_one_exception_with_one_line(data: bytes, said: str) -> None:
    with pytest.raises(PeerJsonError) as raised:
        peer_json.Decoder(Shape).decode(data)
    assert said in str(raised.value) and "\n" not in str(raised.value)
    assert isinstance(raised.value, ValueError)


def test_loads_takes_what_python_writes() -> None:
    assert peer_json.loads('{"a": NaN}')["a"] != peer_json.loads('{"a": NaN}')["a"]
    with pytest.raises(PeerJsonError):
        peer_json.decode('{"a": NaN}')  # strict JSON has no NaN
    with pytest.raises(PeerJsonError):
        peer_json.loads(b"\xff")


@pytest.mark.parametrize(
    ("text", "strict"),
    [
        (b'{"a": NaN, "b": [Infinity, -Infinity], "c": 1}', b'{"a": null, "b": [null, null], "c": 1}'),
        (b'{"a":NaN}', b'{"a":null}'),
        (b'{"name": "NaN", "x": "Infinity"}', b'{"name": "NaN", "x": "Infinity"}'),
        (b'{"a": NaNx}', b'{"a": NaNx}'),
    ],
)
def test_nan_as_null(text: bytes, strict: Optional[bytes]) -> None:
    assert peer_json.nan_as_null(text) == strict


def test_the_costliest_shapes_cost_little() -> None:
    """4 MiB of brackets alone in the shapes that cost the scan most (few long teeth: many
    passes; many short ones: many runs; strings and escapes): measured 0.02-0.23 s each under
    load on 2 shared cores; the bound here is 20 times that."""
    size = 4 * 2**20
    shapes = {
        "teeth 63": (b"[" * 63 + b"]" * 63) * (size // 126),
        "teeth 9": (b"[" * 9 + b"]" * 9) * (size // 18),
        "comb": b"[" * 60 + b"[][[]]" * (size // 6) + b"]" * 60,
        "strings": (b'"' + b"[" * 9 + b'", ') * (size // 12),
        "escapes": b'"' + b"\\\\" * (size // 2) + b'"',
    }
    for name, text in shapes.items():
        started = time.perf_counter()
        depth(text)
        assert time.perf_counter() - started < 5.0, name
