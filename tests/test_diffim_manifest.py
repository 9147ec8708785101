"""diffim inputs: simulated pairs match their truth; the manifest is checked before compute."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from astropy.io import fits

from outcore.diffim.manifest import SCHEMA, one_pair, read_manifest
from outcore.diffim.simulate import (
    PsfShape,
    expected_snr,
    simulate_pair,
    write_manifest,
    write_pair,
)
from outcore.errors import OutcoreError


def test_expected_snr_has_the_classical_limits():
    g3, g4 = PsfShape("gaussian", 3.0), PsfShape("gaussian", 4.0)
    # noiseless reference: the S/N of PSF photometry on the target, flux * F_n * |P_n| / s_n
    classical = 2.0 * 100.0 * math.sqrt((g4.stamp() ** 2).sum()) / 7.0
    assert expected_snr(100.0, g3, g4, 1e-9, 7.0, 2.0) == pytest.approx(classical, rel=1e-4)
    # equal PSFs and noise: the two noise draws add, S/N falls by sqrt(2)
    one = expected_snr(50.0, g3, g3, 1e-9, 5.0)
    assert expected_snr(50.0, g3, g3, 5.0, 5.0) == pytest.approx(one / math.sqrt(2), rel=1e-6)


def test_moffat_transform_matches_the_dft_of_its_stamp():
    psf = PsfShape("moffat", 3.5, beta=2.5, radius=15)
    size = 256
    dft = np.abs(np.fft.fft2(np.fft.ifftshift(np.pad(psf.stamp(), (size - 31) // 2 + 1)[:size,
                                                                                        :size])))
    k = np.fft.fftfreq(size)
    for index in (3, 10, 30):
        assert psf.transform(np.array([k[index]]))[0] == pytest.approx(dft[index, 0], abs=3e-3)


def test_simulated_pair_holds_its_sources_and_noise():
    sim = simulate_pair((256, 256), seed=2, stars=0, transient_snr=[8.0], moved=1)
    expected = sim.expected(1, 0, 256)  # sources away from the edges keep their whole flux
    flux = sim.flux_ratio * (sim.transients["flux"].sum() + sim.moved["flux"].sum())
    assert expected.sum() - 150.0 * 256**2 == pytest.approx(flux, rel=1e-6)
    noise = sim.image("target") - expected
    assert np.std(noise) == pytest.approx(8.0, rel=0.02)
    # rows are pure functions of the seed: any block reads the same pixels
    assert np.array_equal(sim.rows("target", 100, 300), sim.image("target")[100:300])
    assert sim.transients["snr"][0] == 8.0
    shift = np.hypot(sim.moved["x_new"] - sim.moved["x"], sim.moved["y_new"] - sim.moved["y"])
    assert 3.0 <= shift[0] <= 5.0
    assert sim.transients["flux"][0] * sim.snr(1.0) == pytest.approx(8.0)


@pytest.fixture()
def written(tmp_path):
    sim = simulate_pair((64, 64), seed=1, stars=3, margin=10.0)
    item = write_pair(sim, tmp_path, "p1", variance=True, mask=True)
    return sim, item, write_manifest([item], tmp_path / "pairs.json")


def test_manifest_round_trip(written):
    sim, _, manifest = written
    (pair,), files = read_manifest(manifest)
    assert pair.item_id == "p1" and pair.shape == (64, 64)
    assert np.array_equal(pair.target.read(0, 64, 0, 64), sim.image("target"))
    assert pair.reference_psf.sum() == pytest.approx(1.0)
    assert np.allclose(pair.reference_psf, sim.psf[0].stamp())
    assert "RA---TAN" in pair.wcs_header
    assert len(files) == 7 and pair.flux_ratio is None


def _edit(manifest, change):
    record = json.loads(manifest.read_text())
    change(record["items"][0])
    manifest.write_text(json.dumps(record))


def _refused(manifest, *words):
    with pytest.raises(OutcoreError) as err:
        read_manifest(manifest)
    text = str(err.value)
    assert "\n" not in text and "Fix:" in text
    for word in words:
        assert word in text
    return text


def test_a_changed_file_is_refused_by_its_hash(written):
    _, item, manifest = written
    target = manifest.parent / item["target"]["path"]
    with fits.open(target, mode="update") as hdul:
        hdul[0].data[3, 3] += 1.0
    _refused(manifest, "p1:target", "SHA-256", "manifest says")


def test_images_on_different_grids_are_refused(written, tmp_path):
    _, item, manifest = written
    other = simulate_pair((64, 72), seed=1, stars=3, margin=10.0)
    moved = write_pair(other, tmp_path / "other", "q")
    _edit(manifest, lambda it: it.update(target={
        "path": f"other/{moved['target']['path']}", "sha256": moved["target"]["sha256"]}))
    _refused(manifest, "target is 64 x 72", "same pixel grid", "resample")


def test_a_shifted_wcs_is_refused(written):
    _, item, manifest = written
    target = manifest.parent / item["target"]["path"]
    with fits.open(target, mode="update") as hdul:
        hdul[0].header["CRPIX1"] += 2.0
    from outcore.diffim.manifest import sha256_file

    _edit(manifest, lambda it: it["target"].update(sha256=sha256_file(target)))
    _refused(manifest, "WCS", "2 pixels away")


@pytest.mark.parametrize("change, words", [
    (lambda it: it.update(item_id="a b"), ["item_id 'a b'"]),
    (lambda it: it.pop("target"), ["has no 'target'"]),
    (lambda it: it.update(extra=1), ["unknown keys ['extra']"]),
    (lambda it: it["reference"].update(sha256="abc"), ["not 64 hex digits"]),
    (lambda it: it["reference"].update(path="missing.fits"), ["does not exist"]),
    (lambda it: it.update(flux_ratio=-1), ["flux_ratio -1"]),
    (lambda it: it["reference"].update(hdu=3), ["no image HDU 3 with 2 axes"]),
])
def test_bad_items_are_refused_with_one_line(written, change, words):
    _, _, manifest = written
    _edit(manifest, change)
    _refused(manifest, *words)


def test_bad_psf_stamps_are_refused(written):
    _, item, manifest = written
    path = manifest.parent / item["reference_psf"]["path"]
    np.save(path, np.ones((4, 5)))
    from outcore.diffim.manifest import sha256_file

    _edit(manifest, lambda it: it["reference_psf"].update(sha256=sha256_file(path)))
    _refused(manifest, "reference_psf", "odd sides")


def test_duplicate_ids_and_schema(written):
    _, item, manifest = written
    manifest.write_text(json.dumps({"schema": SCHEMA, "items": [item, item]}))
    _refused(manifest, "used twice")
    manifest.write_text(json.dumps({"schema": "other", "items": [item]}))
    _refused(manifest, "schema 'other'")
    manifest.write_text("{")
    _refused(manifest, "not valid JSON")


def test_one_pair_form_hashes_the_files(written):
    _, item, manifest = written
    base = manifest.parent
    (pair,), files = one_pair({"reference": str(base / item["reference"]["path"]),
                               "target": str(base / item["target"]["path"])}, flux_ratio=1.5)
    assert pair.flux_ratio == 1.5 and files[0][2] == item["reference"]["sha256"]
    with pytest.raises(OutcoreError, match="target_psf="):
        one_pair({"reference": str(base / item["reference"]["path"]),
                  "target": str(base / item["target"]["path"]), "target_psf": "nope.npy"})


def test_scaled_16_bit_images_read_as_their_counts(tmp_path):
    """Unsigned 16-bit counts are stored as int16 with BZERO 32768 (a camera's raw frames):
    a window of such an image reads as the counts astropy gives for the whole image (a
    memory-mapped read of a scaled image was refused by astropy as a damaged file)."""
    from outcore.diffim.manifest import ImageFile

    counts = np.random.default_rng(3).integers(0, 65535, (40, 50)).astype(np.uint16)
    fits.PrimaryHDU(counts).writeto(tmp_path / "raw.fits")
    with fits.open(tmp_path / "raw.fits") as hdul:
        assert hdul[0].header["BZERO"] == 32768
    image = ImageFile(str(tmp_path / "raw.fits"), 0, counts.shape, "")
    np.testing.assert_array_equal(image.read(5, 25, 10, 45), counts[5:25, 10:45])
