"""Errors that say where the problem is and what to do about it."""


class BenchError(Exception):
    """Base class: every error the library raises on purpose."""


class ScenarioError(BenchError):
    """A scenario could not be measured; names the scenario and the stage that failed."""

    def __init__(self, scenario: str, problem: str):
        self.scenario = scenario
        prefix = f"scenario {scenario!r}: "
        if problem.startswith(prefix):  # a record's own message already names it
            problem = problem[len(prefix):]
        self.problem = problem
        super().__init__(f"scenario {scenario!r}: {problem}")


class InvalidRecord(BenchError, ValueError):
    """A record was built with values that cannot be true (NaN timings, negative counts...)."""


class StorageError(BenchError):
    """A result, baseline or state file cannot be used; names the file and, where known, the field."""

    def __init__(self, path, problem: str, field: str | None = None, hint: str | None = None):
        self.path = str(path)
        self.field = field
        self.problem = problem
        where = f"{self.path}" + (f", field {field!r}" if field else "")
        msg = f"{where}: {problem}"
        if hint:
            msg += f" ({hint})"
        super().__init__(msg)


class RevisionError(BenchError):
    """Another git revision cannot be compared (extracted, loaded, built); says which side and what to do."""
