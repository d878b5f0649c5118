"""Shared test infrastructure: process launcher (`process`, `controller`), reverse-proxy base (`proxy`),
`eventually` (`poll`), metrics parsing (`metrics_text`), tenant worlds (`world`), in-memory seams (`memory`).

Lives inside the package (not under tests/) so that the test suites, the benchmarks and the dev
harness in `licensectl_dev.devcluster` import one copy. Nothing in the controller imports it.
"""
