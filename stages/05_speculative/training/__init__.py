"""Training the EAGLE head that eagle.py drafts with (the shipped one is eagle_smollm2_135m.safetensors).

    python -m course.s05_speculative.training.train_eagle     # ~1 h on 2 CPU cores, resumable

Read in this order: eagle_data.py (ShareGPT answers and self-distilled ones, the target's features
over them, the draft vocabulary), eagle_training.py (training-time test: the head unrolled for
several chained steps at once; the loss; the accepted-length figure), train_eagle.py (the run).
"""
