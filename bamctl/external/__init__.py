"""Models bamctl did not train: the BAM authors' checkpoints, Hugging Face models, vLLM.

Each module is one source of models behind the back-end protocol of ``bamctl.backends``:

- ``authors``: a folder with the authors' ``model.pt`` + ``args.json``, mapped onto our
  ``Transformer`` and run by the streaming engine (``bam:PATH``, or the bare path);
- ``hf``: a local Hugging Face causal LM with its own tokenizer (``hf:PATH``);
- ``vllm``: the same through vLLM on GPUs (``vllm:PATH``);
- ``hf_tokenizer``: a local Hugging Face tokenizer behind our ``Tokenizer`` protocol.

Heavy dependencies (transformers, tokenizers, vLLM) are imported inside these modules
only, and only when a reference asks for them.
"""
