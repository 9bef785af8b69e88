"""The lesson's measurement and its shared checks: example grammars, random valid token paths,
xgrammar as the outside reference (testing.py), and masks timed naive vs ours vs xgrammar
(benchmark.py)."""
