"""Deterministic synthetic cardiac-like phantoms written in the ACDC challenge layout.

Each patient: ~112 x 112 in-plane at 1.2-1.6 mm, 6-10 short-axis slices of 8-10 mm, an ED and an
ES frame (ES = contracted ED) and their labels (0 bg, 1 RV, 2 Myo, 3 LV). The image is built so that
intensity alone does not separate the classes:

* textured body (smooth noise at two scales), dark lungs, air outside the body, 3-6 'organs'
  (blobs of random brightness, one bright vessel-like disk close to the heart);
* myocardium intensity close to the surrounding tissue, RV and LV blood pools both bright, an
  unlabelled RV free wall of myocardium-like intensity;
* per-patient size, position, ellipticity, orientation, contrast, pathology group (NOR, MINF,
  DCM, HCM, RV change LV size, wall thickness, RV size and contraction);
* radii shrink toward the base and, more, toward the apex; apical slices lack the RV;
* partial-volume blur, multiplicative bias field, Rician noise, int16 storage like the scanner files.

All arrays are built vectorised over (x, y, slice); 20 patients take a few seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .common import DataPrepError, log, parse_bool, parse_int, temp_output

GROUPS = ("NOR", "MINF", "DCM", "HCM", "RV")
MARKER = "synthetic_phantoms.json"
VERSION = 1


def _smooth_noise(rng, shape, sigma_px: float) -> np.ndarray:
    """Zero-mean, unit-std Gaussian-filtered white noise, filtered per slice (axes 0, 1) via FFT."""
    w = rng.standard_normal(shape).astype(np.float32)
    fx = np.fft.fftfreq(shape[0])[:, None]
    fy = np.fft.rfftfreq(shape[1])[None, :]
    h = np.exp(-2.0 * (np.pi * sigma_px) ** 2 * (fx**2 + fy**2)).astype(np.float32)
    out = np.fft.irfft2(np.fft.rfft2(w, axes=(0, 1)) * h[..., None], s=shape[:2], axes=(0, 1)).astype(np.float32)
    out -= out.mean()
    sd = out.std()
    return out / sd if sd > 0 else out


def _blur(img: np.ndarray, sigma_px: float) -> np.ndarray:
    fx = np.fft.fftfreq(img.shape[0])[:, None]
    fy = np.fft.rfftfreq(img.shape[1])[None, :]
    h = np.exp(-2.0 * (np.pi * sigma_px) ** 2 * (fx**2 + fy**2)).astype(np.float32)
    return np.fft.irfft2(np.fft.rfft2(img, axes=(0, 1)) * h[..., None], s=img.shape[:2], axes=(0, 1)).astype(np.float32)


def _ellipse_dist(x, y, cx, cy, a, b, theta):
    """Normalised elliptical 'radius' (1 on the ellipse boundary); broadcasts over slices."""
    c, s = np.cos(theta), np.sin(theta)
    dx, dy = x - cx, y - cy
    u = (dx * c + dy * s) / a
    v = (-dx * s + dy * c) / b
    return np.sqrt(u * u + v * v)


def _profile(t: np.ndarray, peak: float) -> np.ndarray:
    """Radius factor along the long axis: 1 at `peak`, ~0.75 at the base (t=0), ~0.35 at the apex."""
    w = np.where(t < peak, 0.45 * peak / 0.3, 0.75)
    return np.sqrt(np.clip(1.0 - ((t - peak) / w) ** 2, 0.02, None))


def _anatomy(rng, group: str, fov: tuple[float, float]) -> dict:
    """The heart's shape and motion (mm, radians) of a patient of pathology ``group`` in a field of view ``fov``."""
    r_lv = rng.uniform(17.0, 23.0) * {"NOR": 1.0, "MINF": 1.15, "DCM": 1.35, "HCM": 0.8, "RV": 0.95}[group]
    wall = rng.uniform(6.0, 8.5) * {"NOR": 1.0, "MINF": 0.9, "DCM": 0.75, "HCM": 1.7, "RV": 1.0}[group]
    r_rv = r_lv * rng.uniform(1.25, 1.55) * (1.4 if group == "RV" else 1.0)
    ef_lv = {"NOR": (0.55, 0.7), "MINF": (0.2, 0.4), "DCM": (0.1, 0.3), "HCM": (0.65, 0.8), "RV": (0.5, 0.65)}[group]
    ef_lv = rng.uniform(*ef_lv)
    ef_rv = rng.uniform(0.2, 0.35) if group == "RV" else rng.uniform(0.4, 0.6)
    ecc = rng.uniform(0.0, 0.18)
    theta = rng.uniform(0, np.pi)
    phi = 0.8 * np.pi + rng.uniform(-0.45, 0.45)  # RV direction (roughly consistent, like short-axis views)
    cx, cy = rng.uniform(-14, 14), rng.uniform(-14, 14)
    peak = rng.uniform(0.2, 0.4)
    t_rv_end = rng.uniform(0.68, 0.85)
    return dict(r_lv=r_lv, wall=wall, r_rv=r_rv, ef_lv=ef_lv, ef_rv=ef_rv, ecc=ecc, theta=theta, phi=phi, cx=cx, cy=cy,
                peak=peak, t_rv_end=t_rv_end, fov=fov)


def _intensities(rng) -> dict:
    """Tissue, myocardium and blood-pool intensities, the noise level and the int16 scale of a patient."""
    tissue = rng.uniform(0.28, 0.42)
    myo_i = tissue + rng.uniform(-0.06, 0.06)
    lv_i = rng.uniform(0.72, 0.95)
    rv_i = lv_i * rng.uniform(0.85, 1.05)
    noise_sigma = rng.uniform(0.02, 0.05)
    scale = rng.uniform(400.0, 1200.0)
    return dict(tissue=tissue, myo_i=myo_i, lv_i=lv_i, rv_i=rv_i, noise_sigma=noise_sigma, scale=scale)


def _background(rng, grid: dict, a: dict, i: dict) -> tuple[np.ndarray, np.ndarray]:
    """The static background shared by ED and ES: ``(body, bg)``, the body's elliptical 'radius' and the textured
    tissue with dark lungs and 3-6 organs (the first a bright vessel-like disk next to the heart)."""
    x, y, t, shape, sp = grid["x"], grid["y"], grid["t"], grid["shape"], grid["sp"]
    (fov_x, fov_y), cx, cy, phi = a["fov"], a["cx"], a["cy"], a["phi"]
    body = _ellipse_dist(x, y, rng.uniform(-5, 5), rng.uniform(-5, 5), 0.47 * fov_x * rng.uniform(0.95, 1.1),
                         0.43 * fov_y * rng.uniform(0.95, 1.1), rng.uniform(-0.3, 0.3))
    bg = i["tissue"] + 0.10 * _smooth_noise(rng, shape, 6.0 / sp) + 0.05 * _smooth_noise(rng, shape, 1.5 / sp)
    for side in (-1.0, 1.0):  # lungs: dark, lateral to the heart
        lung = _ellipse_dist(x, y, cx + side * rng.uniform(42, 55), cy + rng.uniform(-15, 15),
                             rng.uniform(18, 26), rng.uniform(30, 45), rng.uniform(-0.4, 0.4))
        bg = np.where(lung < 1.0, rng.uniform(0.04, 0.12) + 0.03 * _smooth_noise(rng, shape, 3.0 / sp), bg)
    n_org = int(rng.integers(3, 7))
    for k in range(n_org):
        if k == 0:  # bright vessel-like disk next to the heart (aorta-ish): bright like the blood pools
            ang = phi + np.pi + rng.uniform(-0.8, 0.8)
            d = rng.uniform(35, 45)
            ox, oy, ra, rb, val = (cx + d * np.cos(ang), cy + d * np.sin(ang), rng.uniform(7, 11), rng.uniform(7, 11),
                                   i["lv_i"] * rng.uniform(0.85, 1.05))
        else:
            ox, oy = rng.uniform(-0.4, 0.4) * fov_x, rng.uniform(-0.4, 0.4) * fov_y
            ra, rb, val = rng.uniform(5, 25), rng.uniform(5, 25), rng.uniform(0.1, 0.9)
        z_ext = rng.uniform(0.3, 1.0)  # organs span part of the stack
        z0 = rng.uniform(0, 1 - z_ext)
        zmask = ((t >= z0) & (t <= z0 + z_ext))[None, None, :]
        blob = _ellipse_dist(x, y, ox, oy, ra, rb, rng.uniform(0, np.pi))
        bg = np.where((blob < 1.0) & zmask, val + 0.04 * _smooth_noise(rng, shape, 2.0 / sp), bg)
    return body, bg


def _textures(rng, grid: dict, fov: tuple[float, float]) -> dict:
    """The multiplicative bias field and the blood-pool and myocardium textures."""
    x, y, shape, sp = grid["x"], grid["y"], grid["shape"], grid["sp"]
    bias = np.exp(0.22 * _smooth_noise(rng, shape[:2] + (1,), 25.0 / sp)
                  + 0.15 * (x / fov[0]) * rng.uniform(-1, 1) + 0.15 * (y / fov[1]) * rng.uniform(-1, 1)).astype(np.float32)
    blood_tex = 0.04 * _smooth_noise(rng, shape, 1.2 / sp)  # trabeculation-like texture in the pools
    myo_tex = 0.03 * _smooth_noise(rng, shape, 2.0 / sp)
    return dict(bias=bias, blood_tex=blood_tex, myo_tex=myo_tex)


def _phase_radii(a: dict, phase: str) -> tuple[float, float, float]:
    """``(r_endo, r_rv, wall)`` at ``phase``: ED as drawn, ES contracted by the ejection fractions with the
    myocardial area conserved."""
    if phase == "ED":
        return a["r_lv"], a["r_rv"], a["wall"]
    r_endo = a["r_lv"] * np.sqrt(1.0 - a["ef_lv"])
    r_epi_ed = a["r_lv"] + a["wall"]
    wall = np.sqrt(r_endo**2 + (r_epi_ed**2 - a["r_lv"] ** 2)) - r_endo  # myocardial area conserved
    return r_endo, a["r_rv"] * np.sqrt(1.0 - a["ef_rv"]), wall


def _phase_label(grid: dict, a: dict, phase: str) -> tuple[np.ndarray, np.ndarray]:
    """``(label, rv_wall_out)`` at ``phase``: the classes (0 bg, 1 RV, 2 Myo, 3 LV) and the unlabelled RV free wall."""
    x, y, f, f_rv = grid["x"], grid["y"], grid["f"], grid["f_rv"]
    r_endo, r_rv_p, w_p = _phase_radii(a, phase)
    epi = (r_endo + w_p) * f  # per-slice epicardial radius
    endo = np.clip(epi - w_p * (1.0 + 0.25 * (f < 0.6)), 0.0, None)
    r = _ellipse_dist(x, y, a["cx"], a["cy"], 1.0 + a["ecc"], 1.0 - a["ecc"], a["theta"])  # LV ellipse 'radius' (mm)
    lv = r < endo
    myo = (r >= endo) & (r < epi)
    a_rv = np.maximum(r_rv_p * 0.75 * f_rv, 1e-3)
    b_rv = np.maximum(r_rv_p * 1.15 * f_rv, 1e-3)
    off = epi * 0.8 + 0.2 * a_rv
    rcx, rcy = a["cx"] + off * np.cos(a["phi"]), a["cy"] + off * np.sin(a["phi"])
    d_rv = _ellipse_dist(x, y, rcx, rcy, a_rv, b_rv, a["phi"])
    rv_wall_out = (d_rv < 1.0 + 3.0 / b_rv) & (r >= epi) & (f_rv > 0.05)
    rv = (d_rv < 1.0) & (r >= epi + 2.0) & (f_rv > 0.05)
    label = np.zeros(grid["shape"], np.uint8)
    label[rv] = 1
    label[myo] = 2
    label[lv] = 3
    return label, rv_wall_out


def _phase_image(rng, label: np.ndarray, rv_wall_out: np.ndarray, body, bg, i: dict, tex: dict) -> np.ndarray:
    """The int16 image of one phase: intensities by class, partial-volume blur, bias field, Rician noise."""
    img = np.where(body < 1.0, bg, 0.02).astype(np.float32)  # 0.02: air outside the body
    img = np.where(rv_wall_out, i["myo_i"] + tex["myo_tex"], img)  # RV free wall + septum edge, labelled 0
    img = np.where(label == 2, i["myo_i"] + tex["myo_tex"], img)
    img = np.where(label == 1, i["rv_i"] + tex["blood_tex"], img)
    img = np.where(label == 3, i["lv_i"] + tex["blood_tex"], img)
    img = _blur(img, 0.6)
    img = np.clip(img, 0.0, None) * tex["bias"]
    n1 = rng.standard_normal(label.shape).astype(np.float32) * i["noise_sigma"]
    n2 = rng.standard_normal(label.shape).astype(np.float32) * i["noise_sigma"]
    img = np.sqrt((img + n1) ** 2 + n2**2)
    return np.round(img * i["scale"]).clip(0, 32767).astype(np.int16)


def _grid(nx: int, ny: int, nz: int, sp: float, a: dict) -> dict:
    """Voxel-centre coordinates (mm, broadcastable over (x, y, slice)), the slice positions t in (0, 1) and the
    per-slice radius profiles of the LV (``f``) and RV (``f_rv``)."""
    t = (np.arange(nz) + 0.5) / nz
    f = _profile(t, a["peak"])[None, None, :]
    return {"x": ((np.arange(nx) - nx / 2 + 0.5) * sp)[:, None, None].astype(np.float32),
            "y": ((np.arange(ny) - ny / 2 + 0.5) * sp)[None, :, None].astype(np.float32),
            "t": t, "f": f, "f_rv": f * np.sqrt(np.clip((a["t_rv_end"] - t) / 0.12, 0.0, 1.0))[None, None, :],
            "shape": (nx, ny, nz), "sp": sp}


def make_patient(seed: int, index: int) -> dict:
    """All arrays and metadata of one synthetic patient (deterministic in (seed, index))."""
    rng = np.random.default_rng([int(seed), int(index), 31337])
    group = GROUPS[(index - 1) % len(GROUPS)]
    nx = 112 + 8 * int(rng.integers(-1, 2))
    ny = 112
    nz = int(rng.integers(6, 11))
    sp = float(np.round(rng.uniform(1.2, 1.6), 4))
    dz = float(np.round(rng.uniform(8.0, 10.0), 2))
    a = _anatomy(rng, group, (nx * sp, ny * sp))
    i = _intensities(rng)
    grid = _grid(nx, ny, nz, sp, a)
    body, bg = _background(rng, grid, a, i)
    tex = _textures(rng, grid, a["fov"])
    frames = {}
    for phase in ("ED", "ES"):
        label, rv_wall_out = _phase_label(grid, a, phase)
        frames[phase] = (_phase_image(rng, label, rv_wall_out, body, bg, i, tex), label)
    es_frame = int(rng.integers(9, 16))
    info = {"ED": 1, "ES": es_frame, "Group": group, "Height": float(np.round(rng.uniform(150, 195), 1)),
            "NbFrame": int(rng.integers(max(es_frame + 8, 25), 31)), "Weight": float(np.round(rng.uniform(50, 110), 1))}
    return {"patient": f"patient{index:03d}", "group": group, "spacing": (sp, sp, dz), "frames": frames, "info": info}


def write_patient(p: dict, root: Path) -> None:
    import nibabel as nib

    nib.openers.Opener.default_compresslevel = 1
    pdir = root / p["patient"]
    pdir.mkdir(parents=True, exist_ok=True)
    info = p["info"]
    (pdir / "Info.cfg").write_text(
        f"ED: {info['ED']}\nES: {info['ES']}\nGroup: {info['Group']}\nHeight: {info['Height']}\n"
        f"NbFrame: {info['NbFrame']}\nWeight: {info['Weight']}\n"
    )
    sx, sy, sz = p["spacing"]
    affine = np.diag([sx, sy, sz, 1.0])
    for phase, (img, lab) in p["frames"].items():
        fr = info[phase]
        for arr, suffix in ((img, ""), (lab, "_gt")):
            im = nib.Nifti1Image(arr, affine)
            im.header.set_xyzt_units("mm")
            im.header.set_sform(affine, code=1)
            im.header.set_qform(affine, code=1)
            nib.save(im, str(pdir / f"{p['patient']}_frame{fr:02d}{suffix}.nii.gz"))


def generate_into(out: Path, num_patients: int = 20, seed: int = 0) -> None:
    """Write the phantoms into `out` (out/training/patientNNN/..., out/synthetic_phantoms.json)."""
    num_patients, seed = parse_int(num_patients, "num_patients", 1), parse_int(seed, "seed", 0)
    root = Path(out) / "training"
    root.mkdir(parents=True, exist_ok=True)
    for i in range(1, int(num_patients) + 1):
        write_patient(make_patient(seed, i), root)
    with open(Path(out) / MARKER, "w") as f:
        json.dump({"generator": "data_prep.synthetic", "version": VERSION, "seed": int(seed),
                   "num_patients": int(num_patients), "layout": "ACDC challenge"}, f, indent=1)
        f.write("\n")


def generate(dst, num_patients: int = 20, seed: int = 0, overwrite: bool = False) -> Path:
    dst = Path(dst).absolute()
    num_patients, seed = parse_int(num_patients, "num_patients", 1), parse_int(seed, "seed", 0)
    overwrite = parse_bool(overwrite, "overwrite")
    if dst.exists() and any(dst.iterdir()) and not overwrite and not (dst / MARKER).is_file():
        raise DataPrepError(
            f"{dst}: folder is not empty and holds no {MARKER} (not synthetic phantoms); refusing to write "
            "into it (pass --overwrite to replace it)"
        )
    with temp_output(dst) as tmp:
        generate_into(tmp, num_patients, seed)
    log.info("synthetic: wrote %d patients (seed %d) in the ACDC layout to %s", int(num_patients), int(seed), dst)
    return dst
