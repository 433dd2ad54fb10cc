"""logger=wandb (in W&B's offline mode): the run gets what TensorBoard and scalars.jsonl get, and more."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import cartpole_config

from examples.cartpole import CartpoleTask
from ksim.reporting import SCALARS_FILE

BLOCK = 32768
FULL, FIRST, LAST = 1, 2, 4  # LevelDB log fragment types (3: a middle fragment)


def wandb_records(path: Path) -> list[Any]:
    """The records of an offline run's .wandb file: LevelDB's log format (32 KiB blocks of length-prefixed
    fragments) after a 7-byte W&B header, each record a protobuf `Record`."""
    from wandb.proto import wandb_internal_pb2

    raw, position, pending, records = path.read_bytes(), 7, b"", []
    while position + 7 <= len(raw):
        left = BLOCK - position % BLOCK
        if left < 7:  # a block's tail too short for a fragment header is padding
            position += left
            continue
        _, length, kind = struct.unpack("<IHB", raw[position : position + 7])
        fragment, position = raw[position + 7 : position + 7 + length], position + 7 + length
        pending = fragment if kind in (FULL, FIRST) else pending + fragment
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def finished_records(path: Path, timeout_s: float = 60.0) -> list[Any]:
    """The run's records once its exit record is on disk (W&B's service may still be writing after finish())."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = wandb_records(path)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.5)


def history_rows(records: list[Any]) -> list[dict[str, Any]]:
    rows = [r.history for r in records if r.WhichOneof("record_type") == "history"]
    return [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in row.item} for row in rows]


def test_offline_wandb_run_gets_the_scalars_config_and_learning_curve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    config = cartpole_config(logger="wandb", run_dir=str(tmp_path))
    CartpoleTask(config).run()

    (run_file,) = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    records = finished_records(run_file)
    rows = history_rows(records)
    logged = [json.loads(line) for line in (tmp_path / SCALARS_FILE).read_text().splitlines()]
    assert len(rows) == len(logged) + 1  # one row per log step, then the learning curve
    for row, line in zip(rows, logged, strict=False):
        assert row["train_step"] == line.pop("step")
        assert {key: row[key] for key in line} == pytest.approx(line)
    assert rows[-1]["learning_curve/_type"] == "image-file"
    assert (run_file.parent / "files" / rows[-1]["learning_curve/path"]).is_file()
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    config_values = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config_values["num_envs"] == config.num_envs and config_values["logger"] == "wandb"


def test_unknown_logger_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        CartpoleTask.launch(cartpole_config(), ["logger=mlflow"])
    assert exit_info.value.code == 2
    assert "logger='mlflow' must be one of 'tensorboard', 'wandb'" in capsys.readouterr().err
