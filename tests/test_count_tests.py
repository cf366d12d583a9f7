"""``scripts/count_tests.py`` reports what pytest collects, per folder, so no test count needs to be
typed into tests/README.md (where it would go stale with the next test)."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_script():
    spec = importlib.util.spec_from_file_location("count_tests", ROOT / "scripts" / "count_tests.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_counts_follow_what_pytest_collects_per_folder(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: slow\n    long: long\n")
    (tmp_path / "tests" / "data").mkdir(parents=True)
    (tmp_path / "tests" / "data" / "test_one.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.parametrize('n', [1, 2, 3])\ndef test_fast(n):\n    pass\n\n"
        "@pytest.mark.slow\ndef test_slow():\n    pass\n\n"
        "@pytest.mark.slow\n@pytest.mark.long\ndef test_long():\n    pass\n"
    )
    (tmp_path / "tests" / "test_two.py").write_text("def test_alone():\n    pass\n")
    count_tests = load_script()
    table = count_tests.table(count_tests.collected(["tests"], tmp_path),
                              count_tests.collected(["tests"], tmp_path, "slow"),
                              count_tests.collected(["tests"], tmp_path, "long"))
    assert table.splitlines()[2:] == [
        "| `data/` | 5 | 2 | 1 |",
        "| `test_two.py` | 1 | 0 | 0 |",
        "| all | 6 | 2 | 1 |",
    ]


def test_a_folder_that_does_not_collect_is_an_error_not_a_zero(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_broken.py").write_text("import no_such_module_anywhere\n")
    count_tests = load_script()
    with pytest.raises(SystemExit, match="(?s)could not collect.*no_such_module_anywhere"):
        count_tests.collected(["tests"], tmp_path)
