"""``python -m bnn_zoo``: list, fit and compare with tiny flags through ``main(argv)``."""

from __future__ import annotations

import torch

from bnn_zoo import data, zoo
from bnn_zoo._harness import cli


def test_list_shows_every_entry(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    for name in zoo.names():
        assert name in out and zoo.get(name).source in out  # each entry's paper
    assert 'Blundell et al. 2015, "Weight Uncertainty in Neural Networks"' in out


def test_fit_prints_metrics_and_writes_json(tmp_path, capsys):
    code = cli.main(["fit", "--entry", "map", "--data", "sine", "--steps", "20",
                     "--num-samples", "10", "--out", str(tmp_path)])
    assert code == 0
    out = capsys.readouterr().out
    assert "rmse" in out and "ll" in out and "fit_seconds" in out
    for suffix in (".md", ".csv", ".json"):
        assert (tmp_path / f"map_sine_split0{suffix}").exists()
    assert "| map | sine | 0 | 0 |" in (tmp_path / "map_sine_split0.md").read_text()


def test_compare_writes_table_files_and_bands(tmp_path, capsys):
    code = cli.main(["compare", "--entries", "map", "mean_field", "--steps", "20",
                     "--num-samples", "10", "--out", str(tmp_path)])
    assert code == 0
    out = capsys.readouterr().out
    assert "| map | 1 |" in out and "| mean_field | 1 |" in out
    for name in ("compare.md", "compare.csv", "compare.json", "bands_sine.png"):
        assert (tmp_path / name).exists()


def test_compare_defaults_are_the_readme_job():
    args = cli.build_parser().parse_args(["compare"])
    assert args.data == ["sine"] and args.entries == list(cli.QUICK_ENTRIES)
    assert args.splits == 1 and args.reference == "auto" and str(args.out) == "results/compare"
    assert args.seed == 0 and args.threads is None and args.device == torch.device("cpu")
    assert set(cli.QUICK_ENTRIES) <= set(zoo.names("regression"))
    # "all" is parsed once, into None (every entry supporting the task), for every script.
    assert cli.build_parser().parse_args(["compare", "--entries", "all"]).entries is None


def test_bad_input_is_one_line_and_exit_code_2(tmp_path, capsys):
    assert cli.main(["compare", "--entries", "no_such_entry", "--out", str(tmp_path)]) == 2
    assert "argument --entries: Unknown zoo entry 'no_such_entry'" in capsys.readouterr().err
    assert cli.main(["fit", "--entry", "map", "--data", "sine", "--threads", "0"]) == 2
    assert "argument --threads: expected an integer >= 1, got '0'" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_bad_command_exits_with_2(capsys):
    assert cli.main(["no_such_command"]) == 2
    assert "invalid choice: 'no_such_command'" in capsys.readouterr().err


def test_datasets_lists_every_name_with_its_task(capsys):
    assert cli.main(["datasets"]) == 0
    lines = capsys.readouterr().out.splitlines()[1:]
    assert [line.split()[0] for line in lines] == data.names()
    assert cli.main(["datasets", "--task", "classification"]) == 0
    rows = [line.split()[:2] for line in capsys.readouterr().out.splitlines()[1:]]
    assert [name for name, _ in rows] == ["two_moons", "breast_cancer", "digits", "wine",
                                          "mnist1d"]
    assert {task for _, task in rows} == {"classification"}
