"""Everything GGUF, in one package:

    reader.py     the file's header (metadata and tensor index) from a memory map, every count, length
                  and offset checked against the file before anything is built from it
    meta.py       typed reads of the metadata, and the check that the model it describes is the tensors'
    tokenizer.py  a `tokenizers.Tokenizer` from the tokenizer metadata (byte-level BPE, SentencePiece)
    layouts.py    GGML's quantized block layouts, unpacked once (integers, scales, minimums)
    dequant.py    tensors to float32 through their layouts
    convert.py    a GGUF file as a cached Hugging Face folder (config, tokenizer, float32 safetensors)
    blocks.py     the file's quantized matrices kept as rows of blocks (`--quantization gguf`)
    repack.py     blocks -> our packed int4 / int8-g32 tensors, exactly where the grid allows
    kept.py       the kept-block weight formats, chosen per layer from the file's tensor types
    load.py       what `--quantization gguf` hands model construction: formats and the file's tensors

The `gguf` pip package (gguf-py) supplies the format's constants (GGML types, block and type sizes) and,
in the tests, its writer and reference dequantization. Its reader is not used: `GGUFReader` builds a
numpy view per string of a vocabulary (seconds for 49k tokens) and sizes arrays from the header's
counts before checking them against the file, so a hostile header can make it allocate what the file
cannot back; reader.py refuses such a file with a ModelLoadError naming the field (tests/test_gguf_fuzz.py,
tests/test_model_limits.py). Nothing here imports gguf-py at package import, so loading a Hugging Face
folder never pays for it.
"""
