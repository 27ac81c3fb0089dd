"""Scoring pre-trained clusters against labels: the pooled best-cluster Dice rewards clusters that mean the same
structure in every scan, the per-scan Dice does not; NMI is 1 for a relabelling of the labels and 0 for one cluster."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bim.pretrain import cluster_quality as CQ
from bundle_helpers import tool_in_process
best_cluster_dice, cluster_quality, contingency = CQ.best_cluster_dice, CQ.cluster_quality, CQ.contingency
normalised_mutual_information, many_to_one_dice = CQ.normalised_mutual_information, CQ.many_to_one_dice

NAMES = {1: "RV", 2: "Myo", 3: "LV"}


def _scan(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 4, (6, 6, 3), generator=g)


def test_a_consistent_relabelling_scores_perfectly():
    perm = torch.tensor([7, 2, 5, 0])  # class c -> cluster perm[c], the same in every scan
    counts = [contingency(perm[lab], lab, 8, 4) for lab in (_scan(0), _scan(1))]
    q = cluster_quality(counts, NAMES)
    for c, name in NAMES.items():
        assert q["classes"][name]["pooled_dice"] == pytest.approx(1.0)
        assert q["classes"][name]["per_scan_dice"] == pytest.approx(1.0)
        assert q["classes"][name]["cluster"] == int(perm[c])
        assert q["classes"][name]["precision"] == q["classes"][name]["recall"] == pytest.approx(1.0)
        assert q["classes"][name]["many_to_one_dice"] == pytest.approx(1.0)
    assert q["nmi"] == pytest.approx(1.0) and q["scans"] == 2 and q["num_clusters"] == 8


def test_clusters_that_change_meaning_between_scans_lose_only_the_pooled_dice():
    a, b = _scan(0), _scan(1)
    counts = [contingency(torch.tensor([0, 1, 2, 3])[a], a, 4, 4), contingency(torch.tensor([0, 3, 1, 2])[b], b, 4, 4)]
    q = cluster_quality(counts, NAMES)
    for name in NAMES.values():
        assert q["classes"][name]["per_scan_dice"] == pytest.approx(1.0)  # each scan alone is perfectly clustered
        assert q["classes"][name]["pooled_dice"] < 0.8 and q["classes"][name]["consistency"] < 0.8


def test_one_cluster_everywhere_carries_no_information():
    lab = _scan(2)
    counts = contingency(torch.zeros_like(lab), lab, 5, 4)
    assert normalised_mutual_information(counts) == 0.0
    dice, arg = best_cluster_dice(counts)
    n_c = counts.sum(0)
    assert torch.allclose(dice, 2 * n_c / (n_c.sum() + n_c)) and torch.all(arg == 0)


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="same shape"):
        contingency(torch.zeros(3), torch.zeros(4, dtype=torch.long), 2, 2)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 1\]"):
        contingency(torch.zeros(3), torch.tensor([0, 1, 2]), 2, 2)
    with pytest.raises(ValueError, match="at least one scan"):
        cluster_quality([], NAMES)
    lab = torch.tensor([0, 0, 1])  # no pixel of class 2: its Dice is undefined, not 0
    assert math.isnan(float(best_cluster_dice(contingency(lab, lab, 3, 3))[0][2]))


def test_evaluate_names_a_missing_or_wrong_checkpoint(tmp_path):
    handler = CQ.ClusterQualityHandler(None, str(tmp_path / "q.json"))
    net = torch.nn.Conv2d(1, 1, 1)
    with pytest.raises(FileNotFoundError, match="nothing.pt does not exist"):
        handler.evaluate_checkpoint(net, str(tmp_path / "nothing.pt"))
    torch.save({"conv_0.conv.weight": torch.zeros(1)}, tmp_path / "model.pt")  # a backbone file, not a checkpoint
    with pytest.raises(KeyError, match="model.pt has no 'network' entry"):
        handler.evaluate_checkpoint(net, str(tmp_path / "model.pt"))
    assert not (tmp_path / "q.json").exists()


def test_precision_recall_and_many_to_one_tell_a_split_structure_from_a_merged_one():
    lab = torch.tensor([0] * 6 + [3] * 4 + [1] * 2)  # background 6 pixels, LV 4, RV 2
    # LV split over clusters 1 and 2 (nothing else in them): best cluster recall 0.5, precision 1, many-to-one 1
    split = contingency(torch.tensor([0] * 6 + [1, 1, 2, 2] + [3, 3]), lab, 4, 4)
    q = cluster_quality([split], NAMES)["classes"]["LV"]
    assert (q["precision"], q["recall"]) == pytest.approx((1.0, 0.5))
    assert q["pooled_dice"] == pytest.approx(2 * 2 / (2 + 4)) and q["many_to_one_dice"] == pytest.approx(1.0)
    # LV and RV merged into cluster 1: LV's cluster has precision 4/6, recall 1; RV owns no cluster (Dice 0)
    merged = contingency(torch.tensor([0] * 6 + [1] * 6), lab, 2, 4)
    q = cluster_quality([merged], NAMES)["classes"]
    assert (q["LV"]["precision"], q["LV"]["recall"]) == pytest.approx((4 / 6, 1.0))
    assert q["LV"]["many_to_one_dice"] == pytest.approx(2 * 4 / (6 + 4)) and q["RV"]["many_to_one_dice"] == 0.0
    # where the rest of LV's cluster lies: a third of it is RV, none background; its LV share is its precision
    assert q["LV"]["composition"] == pytest.approx({"background": 0.0, "RV": 2 / 6, "Myo": 0.0, "LV": 4 / 6})
    assert cluster_quality([split], NAMES)["classes"]["LV"]["composition"]["LV"] == pytest.approx(1.0)
    assert math.isnan(float(many_to_one_dice(merged)[2]))  # no Myo pixel: undefined, not 0


def test_every_sub_head_is_scored_and_the_first_is_the_headline(demo_dataset, tmp_path):
    from bim.pretrain.model import BIMClusterNet

    torch.manual_seed(0)
    net = BIMClusterNet(num_clusters=6, num_subheads=2, features=(4, 4, 8, 8, 16, 4)).eval()
    x = torch.rand(2, 1, 32, 32)
    both = net.subhead_map_probs(x)
    assert both.shape == (2, 12, 32, 32) and torch.equal(both[:, :6], net.cluster_map_probs(x))
    assert not torch.equal(both[:, :6], both[:, 6:])  # two independent heads
    perm = torch.tensor([3, 5, 0, 1, 4, 2])  # sub-head 1: sub-head 0 with its clusters renumbered
    with torch.no_grad():
        net.cluster_head.heads[1].weight.copy_(net.cluster_head.heads[0].weight[perm])
        net.cluster_head.heads[1].bias.copy_(net.cluster_head.heads[0].bias[perm])
    handler = CQ.ClusterQualityHandler(str(demo_dataset), str(tmp_path / "q.json"), split="test", center_crop=10**4)
    q = handler.score(net)
    assert len(q["subheads"]) == 2 and q["subheads"][0]["classes"] == q["classes"]
    for name, first in q["classes"].items():  # the same clustering, renumbered: the same scores, other indices
        second = q["subheads"][1]["classes"][name]
        assert second["pooled_dice"] == pytest.approx(first["pooled_dice"], rel=1e-12)
        assert second["cluster"] == int(perm.argsort()[first["cluster"]])
    # a window larger than every slice is the whole slice
    assert q["center_crop"]["size"] == 10**4 and q["center_crop"]["classes"] == q["classes"]
    small = CQ.ClusterQualityHandler(str(demo_dataset), str(tmp_path / "q.json"), split="test", center_crop=16).score(net)
    assert small["classes"] == q["classes"] and small["center_crop"]["classes"] != q["classes"]
    assert "center_crop" not in CQ.ClusterQualityHandler(str(demo_dataset), "q.json", split="test",
                                                          center_crop=None).score(net)


@pytest.mark.parametrize("size", [5, 6])
def test_the_centre_window_is_the_fine_tune_evaluations_window(size):
    from bim.inference import CenterCropSlicesd

    volume = torch.arange(9 * 12 * 2).view(9, 12, 2)
    window = CQ.ClusterQualityHandler(None, "q.json", center_crop=size)._center_window(volume)
    expected = CenterCropSlicesd("label", size)({"label": volume[None]})["label"][0]
    assert window.shape == (size, size, 2) and torch.equal(window, torch.as_tensor(expected))
    with pytest.raises(ValueError, match="center_crop must be null or a positive int"):
        CQ.ClusterQualityHandler(None, "q.json", center_crop=0)


def _constant_structures(intensities, sizes):
    """One 1-D 'scan' [N, 1, 1]: class c takes ``sizes[c]`` pixels of intensity ``intensities[c]``."""
    label = torch.cat([torch.full((n,), c) for c, n in enumerate(sizes)])
    image = torch.tensor(intensities, dtype=torch.float32)[label]
    return image.view(-1, 1, 1), label.view(-1, 1, 1)


def test_intensity_bins_recover_structures_that_intensity_alone_separates():
    image, label = _constant_structures([0.1, 0.4, 0.6, 0.9], [50, 50, 50, 50])  # 4 bins of 50 pixels each
    q = cluster_quality(CQ.intensity_bin_counts([image], [label], 4, 4), NAMES)
    for name in NAMES.values():
        assert q["classes"][name]["pooled_dice"] == pytest.approx(1.0, abs=1e-12)
    assert q["nmi"] == pytest.approx(1.0, abs=1e-12)


def test_a_structure_that_shares_its_intensity_with_other_tissue_is_not_one_intensity_bin():
    # background: 100 pixels at 0.1 and 50 at 0.5, the myocardium's intensity; RV 50 at 0.9, Myo 50 at 0.5, LV 50 at 0.7.
    image, label = _constant_structures([0.1, 0.9, 0.5, 0.7], [150, 50, 50, 50])
    image[100:150] = 0.5
    counts = CQ.intensity_bin_counts([image], [label], 4, 4)
    q = cluster_quality(counts, NAMES)
    assert q["classes"]["Myo"]["pooled_dice"] == pytest.approx(2 * 50 / (100 + 50), abs=1e-12)  # its bin: 100 pixels
    assert q["classes"]["Myo"]["precision"] == pytest.approx(0.5, abs=1e-12)
    assert q["classes"]["LV"]["pooled_dice"] == q["classes"]["RV"]["pooled_dice"] == pytest.approx(1.0, abs=1e-12)


def _run_tool(script: str, *args) -> subprocess.CompletedProcess:
    """``python tools/<script> args...``, its output captured as text."""
    tool = Path(__file__).resolve().parents[1] / "tools" / script
    return subprocess.run([sys.executable, str(tool), *map(str, args)], capture_output=True, text=True, timeout=600)


def _tool_refusal(script: str, *args) -> str:
    """The message that ``python tools/<script> args...`` exits with (``tool_in_process``): a refusal of bad
    arguments, which stops before any work."""
    with pytest.raises(SystemExit) as stop:
        tool_in_process(script, *args)
    assert stop.value.code not in (0, None), f"{script} {args}: exited with status {stop.value.code!r}"
    return str(stop.value.code)


def test_the_intensity_reference_scores_a_data_sets_labelled_scans(demo_dataset, tmp_path):
    out = tmp_path / "reference.json"
    proc = _run_tool("cluster_reference.py", "--dataset_dir", demo_dataset, "--num_clusters", 8, "--out", out)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result == CQ.intensity_reference(demo_dataset, "validation", 8)
    assert result["num_clusters"] == 8 and result["scans"] >= 1 and set(result["classes"]) == {"RV", "Myo", "LV"}
    assert "LV: best-cluster Dice" in proc.stdout and "NMI" in proc.stdout
    with pytest.raises(ValueError, match="num_clusters must be an int >= 2"):
        CQ.intensity_reference(demo_dataset, "validation", 1)
    with pytest.raises(ValueError, match="has no key 'tset'"):  # a mistyped split: the datalist's own error
        CQ.intensity_reference(demo_dataset, "tset", 8)


def test_the_spill_tells_a_band_across_the_border_from_tissue_far_away():
    # one 24 x 24 slice: Myo (class 2) is the square [8, 16) x [8, 16); cluster 1 holds Myo's left half, the two
    # columns just left of it (1-2 pixels away) and a 2 x 8 patch 7-8 pixels below it; cluster 0 is everything else
    label = torch.zeros(24, 24, 1, dtype=torch.long)
    label[8:16, 8:16] = 2
    clusters = torch.zeros_like(label)
    clusters[8:16, 8:12] = 1
    clusters[8:16, 6:8] = 1
    clusters[22:24, 8:16] = 1  # rows 22-23: 7-8 pixels below Myo's last row (15)
    counts = contingency(clusters, label, 2, 4)
    spill = CQ.spill_counts(clusters, label, 2, 4)
    assert spill.shape == (4, len(CQ.SPILL_BANDS_PX), 2) and spill[0].sum() == 0  # background is not scored
    q = cluster_quality([counts], NAMES, [spill])["classes"]["Myo"]
    size = 32 + 16 + 16  # Myo's half, the two columns beside it, the patch below
    assert q["cluster"] == 1 and q["precision"] == pytest.approx(32 / size)
    assert q["spill"] == pytest.approx({"1-3px": 16 / size, "4-10px": 16 / size, ">10px": 0.0})
    assert q["precision"] + sum(q["spill"].values()) == pytest.approx(1.0)
    # the patch moved 21-22 pixels below Myo: it spills far
    clusters[22:24, 8:16] = 0
    far = torch.zeros(40, 40, 1, dtype=torch.long)
    far[:24, :24] = clusters
    far_label = torch.zeros_like(far)
    far_label[:24, :24] = label
    far[36:38, 8:16] = 1  # rows 36-37: 21-22 pixels below Myo
    q = cluster_quality([contingency(far, far_label, 2, 4)], NAMES, [CQ.spill_counts(far, far_label, 2, 4)])
    assert q["classes"]["Myo"]["spill"] == pytest.approx({"1-3px": 16 / size, "4-10px": 0.0, ">10px": 16 / size})
    with pytest.raises(ValueError, match="one spill count per scan"):
        cluster_quality([counts], NAMES, [spill, spill])
    with pytest.raises(ValueError, match="bands must be increasing positive ints"):
        CQ.spill_counts(clusters, label, 2, 4, bands=(10, 3))
    with pytest.raises(ValueError, match=r"must be \[H, W, D\] maps"):
        CQ.spill_counts(clusters[..., 0], label[..., 0], 2, 4)


def test_a_context_clustering_separates_a_myocardium_from_other_muscle_of_its_intensity():
    # a ring of intensity 0.5 (Myo) between a bright cavity (LV) and a bright annulus (background), and a disk of the
    # same 0.5 and size far away in dark background: intensity bins cannot tell the two apart, their surroundings can
    yy, xx = torch.meshgrid(torch.arange(64.0), torch.arange(64.0), indexing="ij")
    heart, far = ((yy - 20) ** 2 + (xx - 20) ** 2).sqrt(), ((yy - 46) ** 2 + (xx - 46) ** 2).sqrt()
    label = torch.zeros(64, 64, dtype=torch.long)
    label[heart < 11], label[heart < 7] = 2, 3
    image = torch.full((64, 64), 0.1)
    image[heart < 15] = 0.9
    image[label == 2] = 0.5
    image[far < math.sqrt(int((label == 2).sum()) / math.pi)] = 0.5
    image, label = image[..., None].repeat(1, 1, 2), label[..., None].repeat(1, 1, 2)
    names = {2: "Myo", 3: "LV"}
    bins = cluster_quality(CQ.intensity_bin_counts([image], [label], 6, 4), names)["classes"]["Myo"]
    context = cluster_quality(CQ.context_kmeans_counts([image], [label], 6, 4, sigmas=(2.0, 4.0)), names)["classes"]
    assert bins["pooled_dice"] < 0.7 and bins["precision"] < 0.55  # the ring's bin holds the far disk too
    assert context["Myo"]["pooled_dice"] > 0.95 and context["LV"]["pooled_dice"] > 0.95
    with pytest.raises(ValueError, match="sigmas must be positive"):
        CQ.context_kmeans_counts([image], [label], 6, 4, sigmas=(0.0,))
    with pytest.raises(ValueError, match="num_clusters must be an int >= 2"):
        CQ.context_kmeans_counts([image], [label], 1, 4)


def test_the_context_reference_tool_scores_a_data_sets_labelled_scans(demo_dataset, tmp_path):
    out = tmp_path / "reference.json"  # (the tool's command line: the intensity reference test above)
    tool_in_process("cluster_reference.py", "--dataset_dir", demo_dataset, "--num_clusters", 8,
                     "--context_sigmas", "2,4", "--out", out)
    result = json.loads(out.read_text())
    assert result == CQ.intensity_reference(demo_dataset, "validation", 8, context_sigmas=(2.0, 4.0))
    assert result["clustering"].startswith("k-means, 8 clusters")
    bad = _tool_refusal("cluster_reference.py", "--dataset_dir", demo_dataset, "--context_sigmas", "two")
    assert "--context_sigmas: expected comma-separated positive numbers such as 2,4,8" in bad


def _stripes(background=0.0, myo=1.0, lv=0.5):
    # one 24 x 24 slice of three vertical stripes: background (columns 0-7), Myo (8-15), LV (16-23), each constant
    image, label = torch.full((24, 24, 1), background), torch.zeros(24, 24, 1, dtype=torch.long)
    image[:, 8:16], label[:, 8:16] = myo, 2
    image[:, 16:], label[:, 16:] = lv, 3
    return image, label


@pytest.mark.parametrize("power", [0.5, 0.75, 1.0])
def test_a_borders_edge_strength_is_the_edge_maps_value_on_it(power):
    from bim.pretrain.losses import EPS

    image, label = _stripes()
    r = CQ.border_edge_strength([image], [label], {2: "Myo", 3: "LV"}, power=power, near_px=2)
    # backward differences: the steps 0 -> 1 (column 8) and 1 -> 0.5 (column 16) are the only edges, min-max scaled;
    # the edge map is float32, so the tolerance is a few float32 roundings
    myo_bg, myo_lv = (1 / (1 + EPS)) ** power, (0.5 / (1 + EPS)) ** power
    assert set(r["borders"]) == {"Myo|background", "Myo|LV"}  # background and LV do not touch
    assert r["borders"]["Myo|background"]["mean"] == pytest.approx(myo_bg, rel=1e-6)
    assert r["borders"]["Myo|LV"]["mean"] == pytest.approx(myo_lv, rel=1e-6)
    assert r["borders"]["Myo|LV"]["pixel_pairs"] == r["borders"]["Myo|background"]["pixel_pairs"] == 24
    near = (myo_bg + myo_lv) / 18  # within 2 pixels of a structure: columns 6-23, one edge pixel of each per row
    assert r["neighbourhood_mean"] == pytest.approx(near, rel=1e-6)
    assert r["borders"]["Myo|background"]["contrast"] == pytest.approx(myo_bg / near, rel=1e-6)
    assert r["power"] == power and r["scans"] == 1 and r["near_px"] == 2


def test_a_lower_edge_power_lifts_a_weak_border_towards_a_strong_one():
    image, label = _stripes(lv=0.9)  # Myo|LV a weak step (0.1), Myo|background a strong one (1)
    ratio = {p: (lambda b: b["Myo|LV"]["mean"] / b["Myo|background"]["mean"])(
        CQ.border_edge_strength([image], [label], {2: "Myo", 3: "LV"}, power=p)["borders"]) for p in (0.5, 1.0)}
    assert ratio[1.0] == pytest.approx(0.1, rel=1e-6) and ratio[0.5] == pytest.approx(0.1 ** 0.5, rel=1e-6)


def test_the_border_edge_strength_refuses_bad_input():
    image, label = _stripes()
    with pytest.raises(ValueError, match="as many label maps as images"):
        CQ.border_edge_strength([image], [], {2: "Myo"})
    with pytest.raises(ValueError, match="near_px must be a positive int"):
        CQ.border_edge_strength([image], [label], {2: "Myo"}, near_px=0)
    with pytest.raises(ValueError, match="power"):
        CQ.border_edge_strength([image], [label], {2: "Myo"}, power=0)


def test_the_border_edges_tool_prints_and_writes_the_functions_numbers(demo_dataset, tmp_path):
    out = tmp_path / "borders.json"
    proc = _run_tool("border_edges.py", "--dataset_dir", demo_dataset, "--powers", "0.5,1", "--max_scans", 2,
                     "--out", out)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    images, labels, names = CQ.labelled_volumes(demo_dataset, "training", 2, "test")
    expected = [json.loads(json.dumps(CQ.border_edge_strength(images, labels, names, p))) for p in (0.5, 1.0)]
    assert result == {"split": "training", "results": expected}
    assert "Myo|LV" in result["results"][0]["borders"] and proc.stdout.count("power ") == 2
    for bad in ("two", "0", ","):
        refusal = _tool_refusal("border_edges.py", "--dataset_dir", demo_dataset, "--powers", bad)
        assert "--powers: expected" in refusal, bad
    with pytest.raises(ValueError, match="no labelled 'unlabelled' scans|has no key 'unlabelled'"):
        CQ.labelled_volumes(demo_dataset, "unlabelled", 2, "test")
