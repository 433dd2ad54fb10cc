"""The README's "Writing a task" code is examples/hopper.py, byte for byte."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN = "<!-- hopper.py begin -->\n```python\n"
END = "```\n<!-- hopper.py end -->"


def readme_block() -> str:
    readme = (ROOT / "README.md").read_text()
    assert readme.count(BEGIN) == 1 and readme.count(END) == 1, "the hopper.py markers must appear once each"
    return readme.split(BEGIN)[1].split(END)[0]


def test_readme_hopper_block_is_the_example_file() -> None:
    assert readme_block() == (ROOT / "examples" / "hopper.py").read_text()
