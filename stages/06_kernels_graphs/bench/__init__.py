"""Stage 06's measurements: the decode step side by side and end to end (benchmark.py), each
kernel's bandwidth (bench_kernels.py), the decode kernel's knobs swept (tune_decode.py), and the
roofline they are read against (roofline.py); the NaN-poisoned paged cases and PyTorch oracle
every kernel test uses (testing.py); the notebook's figures (plots.py). Results: ../results/."""
