"""The core: records, statistics, the environment model, errors and the version. Imports no torch and nothing
else of bench_core."""
