"""Tomography on scans nobody here simulated (../shared/real, its README gives the
references): the APS tooth (Data Exchange), read as a user runs it."""

from __future__ import annotations

import numpy as np
import pytest

from outcore.cli import main
from outcore.runs import load_summary

pytestmark = pytest.mark.realdata
COMMON = ["--cluster", "threads", "--no-progress"]
#: The tooth's rotation axis: projection 0 against the mirror of projection 180 (README).
TOOTH_CENTRE = 295.5


def test_the_tooth_s_axis_with_its_angles_from_a_text_file(real_data, tmp_path):
    """The stored theta steps by 180/181 degrees, the projections by 1 degree (README): a
    text file of the right angles, given by --angles, puts the axis within 0.2 px of the
    mirror's column (the stored angles move it by a third of a pixel)."""
    np.savetxt(tmp_path / "angles.txt", np.arange(181.0))
    tooth = real_data / "tomo" / "aps_tooth" / "tooth.h5"
    runs = ["--output-dir", str(tmp_path / "runs")]
    assert main(["tomo", "convert", str(tooth), str(tmp_path / "t.zarr"), "--angles",
                 str(tmp_path / "angles.txt"), "--attr", "detector_pixel_size=1", *COMMON,
                 *runs]) == 0
    assert main(["tomo", "center", "--input", str(tmp_path / "t.zarr"), "--name", "c",
                 *COMMON, *runs]) == 0
    centre = load_summary(tmp_path / "runs" / "c")["metrics"]["center"]
    assert abs(centre - TOOTH_CENTRE) < 0.2, centre
