"""The worker: runs one scheduled step on the model.

    model_runner.py    apply the step's block-table changes, build its inputs, run the model,
                       sample (or verify drafts)
    input_batch.py     the step's chunks -> flat input ids, positions, attention metadata
    block_table.py     the runner's block tables, kept between steps
    cuda_graphs.py     decode steps replayed from CUDA graphs (GPU)
    sampler.py         logits -> next tokens
    spec_decode/       the draft proposers and the rejection sampler

It reads the scheduler's output (`core/`) and calls the model (`model/`); it decides nothing.
"""
