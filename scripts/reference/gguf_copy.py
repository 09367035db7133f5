"""GGUF copies with gguf-py (numpy only, no llama.cpp): every tensor dequantized and handed to
a callback that writes it back, at F32 or re-quantized; all metadata copied. Shared by
make_parity_fixture.py and requantize_model.py (which CI runs, through
scripts/make-test-assets.sh)."""

import gguf
import numpy as np


def write_converted_copy(src: str, dst: str, file_type: int, add_tensor) -> None:
    """Writes `src` with all metadata copied, `general.file_type` set to `file_type`, and each
    tensor handed to `add_tensor(writer, name, f32_values_outermost_first, reader_tensor)`."""
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(dst, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if name == "general.file_type":
            writer.add_key_value(name, file_type, field.types[0])
            continue
        main_type = field.types[0]
        sub_type = field.types[-1] if main_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), main_type, sub_type)
    if "general.file_type" not in reader.fields:
        writer.add_file_type(file_type)
    for tensor in reader.tensors:
        data = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        # GGUF shapes are innermost-first; numpy's are outermost-first.
        shape = tuple(int(n) for n in reversed(tensor.shape))
        add_tensor(writer, tensor.name, np.ascontiguousarray(data, dtype=np.float32).reshape(shape), tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_f32_copy(src: str, dst: str) -> None:
    """Writes `src` with every tensor dequantized to F32 and all metadata copied."""
    write_converted_copy(
        src,
        dst,
        int(gguf.LlamaFileType.ALL_F32),
        lambda writer, name, values, _tensor: writer.add_tensor(name, values),
    )
