"""Real schemas against the compiler: the JSON-Schema-Test-Suite (schema_suite.py), SchemaStore's
schemas compiled by us and by xgrammar (bench_coverage.py), and whether a real model's answers
finish (bench_finish.py). The hand-written schemas are in schemas/."""
