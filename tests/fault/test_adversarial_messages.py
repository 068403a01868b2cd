"""Each message says the true cause and leaks nothing (issue 27, case 9)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from zephon_nodes import Recipe
from zephon_nodes.cli import main
from zephon_nodes.core.errors import CheckpointError, RecipeError
from zephon_nodes.io.storage.storage import redact
from zephon_nodes.state import decode_checked, encode_checked


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("s3://user:secret@bucket/x/*.jsonl", "s3://bucket/x/*.jsonl"),
        ("s3://user:p@ss@bucket/x", "s3://bucket/x"),  # an "@" in the password
        (
            "dataset 'web': https://u:pw@host/a.jsonl: not found",
            "dataset 'web': https://host/a.jsonl: not found",
        ),
        ("'s3://k:s@b/a' and 'gs://k:t@c/b'", "'s3://b/a' and 'gs://c/b'"),
        ("https://host/path@v2/a.jsonl", "https://host/path@v2/a.jsonl"),  # not userinfo
    ],
)
def test_redact_removes_every_userinfo(text, want):
    assert redact(text) == want


def test_the_cli_never_prints_a_uri_password(tmp_path, monkeypatch, capsys):
    """An unreachable S3 endpoint: the one-line error names the bucket, not the secret."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "a")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "b")
    monkeypatch.setenv("ZEPHON_STORAGE_RETRY_S", "0.5")
    assert main(["index", "s3://user:hunter2@bucket/x/*.jsonl", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "hunter2" not in err and "user:" not in err and "s3://bucket/x" in err, err
    assert err.strip().count("\n") == 0


def test_a_checksum_mismatch_shows_where_the_digits_differ():
    """A flip in the 50th digit of the recorded checksum: the two printed prefixes differ."""
    blob = bytearray(encode_checked({"step": 1, "lanes": {}}))
    m = re.match(rb'\{"checksum":"sha256:([0-9a-f]{64})"', bytes(blob))
    assert m is not None
    at = m.start(1) + 49
    blob[at] = ord("0") if blob[at] != ord("0") else ord("1")
    with pytest.raises(CheckpointError) as e:
        decode_checked(bytes(blob), "state.json", allow_unchecked=False)
    said, got = re.findall(r"sha256:([0-9a-f]+)", str(e.value))
    assert said != got and len(said) >= 50, str(e.value)


def test_a_misspelled_tokenizer_table_is_named(tmp_path):
    """[tokeniser] says "did you mean [tokenizer]", not "tokenizer.path is required"."""
    toml = tmp_path / "r.toml"
    toml.write_text(
        'seed = 1\nnum_lanes = 1\nglobal_batch_size = 2\nseq_len = 8\n[tokeniser]\nkind = "bytes"\n'
        '[[datasets]]\nname = "d"\npaths = ["x.jsonl"]\n'
    )
    with pytest.raises(
        RecipeError, match=r"unknown table \[tokeniser\] \(did you mean \[tokenizer\]\?\)"
    ):
        Recipe.from_toml(toml)


def test_every_record_skipped_does_not_blame_the_lane_count(tmp_path, capsys):
    """All records skipped: the message names skipped records, not num_lanes."""
    (tmp_path / "bad.jsonl").write_text(
        "\n".join(json.dumps({"body": i}) for i in range(100)) + "\n"
    )
    toml = tmp_path / "r.toml"
    toml.write_text(
        'seed = 1\nnum_lanes = 2\nglobal_batch_size = 4\nseq_len = 16\non_error = "skip"\n'
        '[tokenizer]\nkind = "bytes"\n[work]\nchunk_size = 4\n'
        f'[[datasets]]\nname = "web"\npaths = ["{tmp_path}/bad.jsonl"]\n'
    )
    assert main(["digest", str(toml), "--steps", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "skipped" in err and "use fewer lanes" not in err, err


def _two_datasets(tmp_path, weights=(1.0, 3.0)) -> Path:
    for name in ("web", "code"):
        (tmp_path / f"{name}.jsonl").write_text(
            "\n".join(json.dumps({"text": f"{name} {i} " * 3}) for i in range(120)) + "\n"
        )
    toml = tmp_path / f"r-{weights[0]}-{weights[1]}.toml"
    datasets = "".join(
        f'[[datasets]]\nname = "{n}"\npaths = ["{tmp_path}/{n}.jsonl"]\nweight = {w}\n'
        for n, w in zip(("web", "code"), weights, strict=True)
    )
    toml.write_text(
        "seed = 1\nnum_lanes = 2\nglobal_batch_size = 4\nseq_len = 16\n"
        '[tokenizer]\nkind = "bytes"\n[work]\nchunk_size = 4\n' + datasets
    )
    return toml


def test_inspect_accepts_the_multi_dataset_recipe_a_checkpoint_was_taken_with(tmp_path, capsys):
    """`inspect CKPT --recipe R` agrees with `digest --resume-from`: yes for R, no for another."""
    toml = _two_datasets(tmp_path)
    ckpt = tmp_path / "ckpt"
    assert (
        main(["digest", str(toml), "--steps", "3", "--save-at", "2", "--checkpoint-dir", str(ckpt)])
        == 0
    )
    capsys.readouterr()
    assert main(["inspect", str(ckpt), "--recipe", str(toml)]) == 0, capsys.readouterr()
    assert main(["digest", str(toml), "--steps", "1", "--resume-from", str(ckpt)]) == 0
    other = _two_datasets(tmp_path, (3.0, 1.0))
    capsys.readouterr()
    assert main(["inspect", str(ckpt), "--recipe", str(other)]) == 1
    assert "differs" in capsys.readouterr().out  # the weights: another recipe
