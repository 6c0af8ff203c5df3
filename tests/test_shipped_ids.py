"""The regenerated ids that ship in data/regen unpack to the files they were packed from."""
import hashlib
import json

import pytest

from jetflow.data import packed
from jetflow.data.regenerate import load_regenerated
from jetflow.util import paths

SHIPPED = paths.REPO / "data" / "regen" / "smollm2-135m-bfloat16-all-256"
VOCAB = 49152  # the embedded target's vocabulary


def test_shipped_ids_unpack_to_their_originals(tmp_path):
    prov = json.loads((SHIPPED / "provenance.json").read_text())
    assert prov["files"], "no part is published"
    for entry in prov["files"]:  # each file at most 25 MB, and its packed bytes as recorded
        path = SHIPPED / entry["packed"]
        assert path.stat().st_size == entry["packed_bytes"] <= packed.MAX_BYTES
        assert hashlib.sha256(path.read_bytes()).hexdigest() == entry["packed_sha256"]
    files = packed.unpack(SHIPPED, tmp_path)  # raises unless every file's sha256 is the original's
    assert [f.name for f in files] == [e["file"] for e in prov["files"]]
    for f, entry in zip(files, prov["files"]):
        rows = load_regenerated(f)
        assert len(rows) == entry["rows"] and sum(entry["sources"].values()) == entry["rows"]
        assert sum(len(r["prompt_ids"]) + len(r["response_ids"]) for r in rows) == entry["tokens"]
        assert all(0 <= t < VOCAB for r in rows for t in r["prompt_ids"] + r["response_ids"])
        assert all(len(r["response_ids"]) <= entry["settings"]["max_new_tokens"] for r in rows)
    # the parts are the first k of the chunked regeneration, in order
    assert [e["settings"]["chunk"] for e in prov["files"]] == list(range(len(prov["files"])))


def test_unpack_refuses_a_folder_without_provenance(tmp_path):
    with pytest.raises(FileNotFoundError, match="provenance.json"):
        packed.unpack(tmp_path, tmp_path / "out")
