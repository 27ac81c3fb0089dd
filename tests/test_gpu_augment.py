"""The batched augmentation and the equivariant pair transform T (paper: p_hat = g(s(T(x))), p_tilde = g(T(s(x))))."""


import pytest
import torch


from bim.gpu_augment import (  # noqa: E402
    EquivariantPairTransform,
    crop_matrices,
    random_affine_matrices,
    random_gamma,
    warp,
)


def test_centre_crop_is_exact_slicing():
    x = torch.arange(2 * 20 * 24, dtype=torch.float32).view(2, 1, 20, 24)
    out = warp(x, crop_matrices(2, (20, 24), (8, 10), random=False), (8, 10))
    assert torch.equal(out, x[:, :, 6:14, 7:17])


def test_random_crop_is_a_window_of_the_input_without_blur():
    g = torch.Generator().manual_seed(3)
    x = torch.rand(4, 1, 30, 30)
    out = warp(x, crop_matrices(4, (30, 30), (16, 16), g), (16, 16))
    offsets = set()
    for b in range(4):
        matches = [(i, j) for i in range(15) for j in range(15) if torch.allclose(out[b, 0], x[b, 0, i : i + 16, j : j + 16], atol=2e-5)]
        assert len(matches) == 1, "a random crop must equal exactly one integer window"
        offsets.add(matches[0])
    assert len(offsets) > 1, "offsets should vary across the batch"


def test_crop_larger_than_image_pads_with_zeros_and_keeps_every_pixel():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(3, 1, 10, 12) + 1.0
    out = warp(x, crop_matrices(3, (10, 12), (16, 16), g), (16, 16))
    assert torch.allclose(out.sum(dim=(1, 2, 3)), x.sum(dim=(1, 2, 3)), rtol=1e-5)
    assert (out.abs() < 1e-4).sum(dim=(1, 2, 3)).tolist() == [16 * 16 - 10 * 12] * 3


def test_labels_warp_with_nearest_and_keep_their_values():
    g = torch.Generator().manual_seed(1)
    lab = torch.randint(0, 4, (2, 1, 32, 32), dtype=torch.uint8)
    m = crop_matrices(2, (32, 32), (24, 24), g) @ random_affine_matrices(2, g, (0.9, 1.1), 20.0, 0.05, flip_prob=0.5)
    out = warp(lab, m, (24, 24), mode="nearest")
    assert out.dtype == torch.uint8 and set(out.unique().tolist()) <= {0, 1, 2, 3}
    with pytest.raises(ValueError, match="nearest"):
        warp(lab, m, (24, 24), mode="bilinear")


def test_affine_parameters_stay_in_their_ranges():
    g = torch.Generator().manual_seed(0)
    m = random_affine_matrices(2000, g, (0.8, 1.3), 45.0, 0.1)
    zoom = 1.0 / torch.sqrt(m[:, 0, 0] ** 2 + m[:, 1, 0] ** 2)
    angle = torch.rad2deg(torch.atan2(m[:, 1, 0], m[:, 0, 0]))
    assert zoom.min() >= 0.8 - 1e-9 and zoom.max() <= 1.3 + 1e-9
    assert angle.abs().max() <= 45.0 + 1e-6 and angle.abs().max() > 40.0
    assert m[:, :2, 2].abs().max() <= 0.2 + 1e-9  # 10 % of the size = 0.2 in normalised [-1, 1] units


def test_gamma_is_identity_at_one_and_monotone():
    x = torch.linspace(0, 1, 50).view(1, 1, 5, 10).repeat(8, 1, 1, 1)
    y = random_gamma(x, torch.Generator().manual_seed(0), (0.5, 2.0))
    assert torch.all(y[:, :, 0, 0] == 0) and torch.allclose(y[:, :, -1, -1], torch.ones(8, 1))
    assert torch.all(torch.diff(y.flatten(1), dim=1) >= 0)
    assert torch.allclose(random_gamma(x, None, (1.0, 1.0)), x)


def test_pair_transform_commutes_with_an_identity_network():
    """s = identity: T(s(x)) and s(T(x)) must coincide (no intensity change in T, same random state)."""
    t = EquivariantPairTransform(gamma_range=None)
    x = torch.rand(6, 3, 40, 40)
    params = t.sample(6, torch.Generator().manual_seed(7))
    assert torch.allclose(t.apply_features(x, params), t.apply_image(x, params), atol=0)


def test_pair_transform_commutes_with_a_linear_pointwise_network():
    """A 1x1 convolution without bias commutes with any resampling (both are linear, one acts on channels)."""
    t = EquivariantPairTransform(gamma_range=None)
    s = torch.nn.Conv2d(1, 5, kernel_size=1, bias=False)
    x = torch.rand(4, 1, 48, 48)
    params = t.sample(4, torch.Generator().manual_seed(11))
    with torch.no_grad():
        err = (s(t.apply_image(x, params)) - t.apply_features(s(x), params)).abs().max()
    assert err < 1e-5


def test_pair_transform_shares_its_random_state_and_gamma_only_touches_the_image():
    t = EquivariantPairTransform(gamma_range=(0.5, 2.0))
    p1 = t.sample(5, torch.Generator().manual_seed(4))
    p2 = t.sample(5, torch.Generator().manual_seed(4))
    assert torch.equal(p1.affine, p2.affine) and torch.equal(p1.gamma_image, p2.gamma_image)
    p3 = t.sample(5, torch.Generator().manual_seed(5))
    assert not torch.equal(p1.affine, p3.affine)
    x = torch.rand(5, 1, 32, 32)
    # the image branch = gamma, then the very same warp as the feature branch
    gamma_x = x.pow(p1.gamma_image.float().view(-1, 1, 1, 1))
    assert torch.allclose(t.apply_image(x, p1), t.apply_features(gamma_x, p1), atol=1e-6)


def test_valid_mask_marks_pixels_sampled_from_inside():
    t = EquivariantPairTransform(gamma_range=None, scale_range=(0.8, 0.8), max_rotation_deg=0.0, max_translation=0.0)
    x = torch.ones(2, 1, 40, 40)
    params = t.sample(2, torch.Generator().manual_seed(0))
    mask = t.valid_mask(params, x)
    warped = t.apply_image(x, params)
    assert torch.all(warped[mask.bool()] > 0.999)
    assert 0.5 < mask.mean() < 0.9  # zoom-out by 0.8 leaves a zero border


def test_host_to_device_casts_and_places_without_changing_values():
    """bim.gpu_augment.host_to_device: the host-drawn parameters of a step (matrices, gamma, jitter, indices) on the
    step's device in the dtype asked for (on a GPU through pinned memory, so the copy does not wait for the GPU)."""
    from bim.gpu_augment import host_to_device

    t = torch.rand(3, 2, 3, dtype=torch.float64)
    out = host_to_device(t[:, :2, :], torch.device("cpu"), torch.float32)
    assert out.dtype == torch.float32 and out.device.type == "cpu" and torch.equal(out, t[:, :2, :].float())
    idx = torch.arange(4)
    assert torch.equal(host_to_device(idx, "cpu"), idx) and host_to_device(idx, "cpu").dtype == torch.int64
    if torch.cuda.is_available():
        on_gpu = host_to_device(t, "cuda", torch.float32)
        assert on_gpu.is_cuda and torch.equal(on_gpu.cpu(), t.float())
