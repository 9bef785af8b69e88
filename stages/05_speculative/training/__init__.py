"""Training the EAGLE heads that eagle.py and eagle3.py draft with (an EAGLE-3 head is written to
eagle3_smollm2_135m.safetensors, the default; an EAGLE-1/2 head to eagle_smollm2_135m.safetensors).

    python -m course.s05_speculative.training.train_eagle --self-distill 6000 --data-only   # hours, resumable
    python -m course.s05_speculative.training.train_eagle --self-distill 6000

Read in this order: eagle_data.py (ShareGPT answers and self-distilled ones, the target's features
over them, the draft vocabulary), batched_decode.py (the self-distillation engine: stage 04's,
with decode steps attended in one batch), eagle_training.py (training-time test: the head
unrolled for several chained steps at once; the loss; the accepted-length figure),
train_eagle.py (the run).
"""
