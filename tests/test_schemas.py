"""The published schemas (schema/*.schema.json): they are what the code generates, and every
golden JSON document is valid against its schema.

Positive controls: a committed file edited by hand (or a Struct changed without ``make
schema``) fails :func:`test_committed_schemas_are_what_the_code_generates`; schema 1's
``null`` in BioEngine's ``total_gpu_memory`` or ``pending_resources`` fails
:func:`test_the_schema_rejects_schema_1s_nulls_in_bioengines_keys`.
"""

import json
from typing import Any

import pytest

from rayscope.render.status import status_ndjson
from tests.golden import GOLDEN
from tests.scenarios import mixed_status
from tests.schemas import DOCUMENTS, SCHEMA_DIR, assert_valid, errors, path_of, schema_text

GOLDEN_JSON = sorted(p.name for p in GOLDEN.glob("*.json"))


def document_of(golden: str) -> str:
    """``status_mixed.json`` -> ``status``: a golden's name starts with its document's."""
    return golden.split("_", 1)[0]


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_committed_schemas_are_what_the_code_generates(name: str) -> None:
    assert path_of(name).exists(), f"schema/{name}.schema.json missing: run `make schema`"
    assert path_of(name).read_text() == schema_text(name), (
        f"schema/{name}.schema.json differs from the Structs: run `make schema` and review the diff"
    )


def test_every_schema_file_belongs_to_a_document() -> None:
    """No file left behind by a document that was renamed or removed."""
    assert sorted(p.name for p in SCHEMA_DIR.glob("*.json")) == sorted(f"{n}.schema.json" for n in DOCUMENTS)


def test_every_golden_json_has_a_schema() -> None:
    assert GOLDEN_JSON, "no golden JSON found"
    assert {document_of(g) for g in GOLDEN_JSON} <= DOCUMENTS.keys(), GOLDEN_JSON


@pytest.mark.parametrize("golden", GOLDEN_JSON)
def test_golden_json_is_valid(golden: str) -> None:
    assert_valid(json.loads((GOLDEN / golden).read_text()), document_of(golden))


def test_an_append_line_is_a_valid_status_document() -> None:
    """``--append`` leads each document with ``timestamp``; the rest is the status document."""
    assert_valid(json.loads(status_ndjson(mixed_status(), include_dead=True)), "status")


def test_the_schema_rejects_schema_1s_nulls_in_bioengines_keys() -> None:
    doc: dict[str, Any] = json.loads((GOLDEN / "status_mixed.json").read_text())
    node = next(iter(doc["nodes"]))
    doc["nodes"][node]["total_gpu_memory"] = None
    doc["nodes"][node]["used_gpu_memory"] = "n/a"
    doc["cluster"]["used_gpu_memory"] = None
    doc["cluster"]["pending_resources"] = None
    found = errors(doc, "status")
    assert [e.split(":", 1)[0] for e in found] == [
        "$.cluster.pending_resources",
        "$.cluster.used_gpu_memory",
        f"$.nodes.{node}.total_gpu_memory",
        f"$.nodes.{node}.used_gpu_memory",
    ], found
    with pytest.raises(AssertionError, match="total_gpu_memory"):
        assert_valid(doc, "status")
