"""The README's examples run as written: a new user copies them first."""
import re
from pathlib import Path

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def _block(section: str) -> str:
    text = README.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", text, re.S).group(1)


def test_the_validation_example_runs_as_written(capsys):
    namespace: dict = {}
    exec(compile(_block("Validating an optimization"), "README.md", "exec"), namespace)
    out = capsys.readouterr().out
    assert "PASS" in out and "group 0: foreach False -> True" in out
    assert namespace["result"].identities["candidate"]["optimizer_settings"]["group 0"]["foreach"] == "True"
