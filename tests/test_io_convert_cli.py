"""``outcore convert`` (the convert family): raw beamline scans are refused with the verb that
converts them now, before anything starts or is written."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from outcore.cli import main


def test_beamline_is_refused_with_tomo_convert(tmp_path, capsys):
    source = tmp_path / "scan.h5"
    with h5py.File(source, "w") as f:
        f["/exchange/data"] = np.ones((4, 3, 5), np.uint16)
    out, runs = tmp_path / "p.zarr", tmp_path / "runs"
    code = main(["convert", str(source), str(out), "--beamline", "--attr",
                 "detector_pixel_size=1e-6", "--output-dir", str(runs), "--no-progress"])
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["outcore convert: error: raw beamline scans are converted by `outcore tomo"
                   " convert` now. Fix: run outcore tomo convert SOURCE OUTPUT with the same"
                   " options."]
    assert not out.exists() and not runs.exists()


def test_beamline_options_are_tomo_converts(tmp_path, capsys):
    """The raw-scan and correction options are not convert's: the parser refuses them."""
    with pytest.raises(SystemExit) as info:
        main(["convert", str(tmp_path / "scan.h5"), str(tmp_path / "p.zarr"), "--flats",
              "/exchange/data_white"])
    assert info.value.code == 2 and "--flats" in capsys.readouterr().err


def test_help_hides_beamline(capsys):
    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    assert "--beamline" not in capsys.readouterr().out
