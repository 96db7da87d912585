"""recsys_common.dataset_tools: the gen_csv / prepare_synthetic_dataset logic both DLRM recipes expose."""
import pytest

from recsys_common import dataset_tools
from recsys_common.criteo import variants


def test_parse_table_sizes_names_the_flag():
    assert dataset_tools.parse_table_sizes("10, 20,3") == [10, 20, 3]
    for bad in ("10,x", "", "5,0"):
        with pytest.raises(ValueError, match="--synthetic_dataset_table_sizes"):
            dataset_tools.parse_table_sizes(bad)


def test_tool_name_is_the_program_and_the_owner_of_the_outputs(tmp_path, capsys):
    parser = dataset_tools.prepare_synthetic_parser("my.tool")
    assert parser.prog == "python -m my.tool"
    dataset_tools.prepare_synthetic_main(["--synthetic_dataset_dir", str(tmp_path), "--synthetic_dataset_num_entries",
                                          "16", "--synthetic_dataset_table_sizes", "4,5"], "my.tool")
    from recsys_common.io import MANIFEST_NAME
    assert '"my.tool"' in (tmp_path / MANIFEST_NAME).read_text()
    # another tool may not overwrite these files, the same tool may
    with pytest.raises(FileExistsError, match="written by my.tool"):
        dataset_tools.prepare_synthetic_main(["--synthetic_dataset_dir", str(tmp_path), "--overwrite",
                                              "--synthetic_dataset_num_entries", "16"], "other.tool")
    dataset_tools.prepare_synthetic_main(["--synthetic_dataset_dir", str(tmp_path), "--overwrite",
                                          "--synthetic_dataset_num_entries", "16"], "my.tool")


def test_variant_feature_spec_unknown_variant():
    with pytest.raises(ValueError, match="criteo_t15_synthetic, criteo_t3_synthetic, criteo_t0_synthetic"):
        variants.variant_feature_spec("criteo_t7_synthetic")
    assert all(len(c) == 26 for c in variants.CARDINALITIES.values())
