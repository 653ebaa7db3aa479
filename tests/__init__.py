"""The suite, laid out like the packages it tests: engine/ (core, model, ops, serving, sim),
loadgen/, cli/ (bench_cli: sweep, claims), docs/ and benchmarks/. Every folder is a package so
that test modules are imported once, by their dotted name (tests.cli.test_report), and may share
a basename; shared fixtures live in the nearest conftest.py."""
