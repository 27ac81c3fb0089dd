"""Where the training slices live: each rank's share of the data (bim.distributed) and the host-memory store streamed
to the device (bim.streaming): shares are disjoint, cover everything and are balanced; the streamed store gives the
same batches as the store on the device for the same seed."""

from __future__ import annotations

import logging

import pytest
import torch

from bim.data import PartitionBatchSampler, RandomSliceSampler, SliceStore
from bim.distributed import scan_share, share_bounds, slice_share
from bim.streaming import HostToDevice, choose_placement, gather_rows, memory_budget_bytes


def synthetic_store(depths=(5, 7, 6, 4, 8), size=12, labels=True, num_partitions=3) -> SliceStore:
    """A store of ``len(depths)`` scans whose every slice is distinct (its value encodes scan and slice)."""
    g = torch.Generator().manual_seed(0)
    images, scan_index, slice_index, parts = [], [], [], []
    for s, d in enumerate(depths):
        images.append(torch.rand(d, 1, size, size, generator=g) + 10 * s)
        scan_index.append(torch.full((d,), s))
        slice_index.append(torch.arange(d))
        parts.append(torch.tensor([min(num_partitions - 1, z * num_partitions // d) for z in range(d)]))
    image = torch.cat(images)
    label = (image > image.mean()).to(torch.uint8) if labels else None
    return SliceStore(image, label, torch.cat(scan_index), torch.cat(slice_index), torch.cat(parts),
                      [f"scan{s}" for s in range(len(depths))], [{"image": f"scan{s}"} for s in range(len(depths))],
                      num_partitions)


@pytest.mark.parametrize("n", [0, 1, 5, 7, 34])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_shares_are_contiguous_disjoint_covering_and_differ_by_at_most_one(n, world):
    bounds = [share_bounds(n, r, world) for r in range(world)]
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))  # contiguous: gathered in rank order = list order
    sizes = [stop - start for start, stop in bounds]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == n


def test_scan_share_splits_lists_and_datasets_and_refuses_more_ranks_than_scans():
    items = [{"image": f"s{i}"} for i in range(5)]
    shares = [scan_share(items, rank=r, world=2) for r in range(2)]
    assert shares == [items[:3], items[3:]]
    assert scan_share(items) is items  # one process: everything, untouched
    subset = scan_share(torch.utils.data.TensorDataset(torch.arange(5)), rank=1, world=2)
    assert [int(subset[i][0]) for i in range(len(subset))] == [3, 4]
    with pytest.raises(ValueError, match=r"^training: 2 scans cannot be shared by 3 processes"):
        scan_share(items[:2], "training", rank=0, world=3)
    assert scan_share(items[:2], "validation", rank=2, world=3, fewer="all") == items[:2]  # each rank validates all


def test_slice_share_keeps_a_balanced_block_of_slices_and_its_scans():
    store = synthetic_store()
    shares = [slice_share(store, rank=r, world=3) for r in range(3)]
    assert [s.num_slices for s in shares] == [10, 10, 10]
    assert torch.equal(torch.cat([s.image for s in shares]), store.image)  # disjoint and covering, in order
    assert torch.equal(torch.cat([s.label for s in shares]), store.label)
    second = shares[1]  # slices 10-19: the last 5 of scan1 (7 slices), scan2 (6), the first 4 of scan3
    assert second.scans == ["scan1", "scan2", "scan3"] and second.items == store.items[1:4]
    assert second.scan_index.tolist() == [0] * 2 + [1] * 6 + [2] * 2
    assert torch.equal(second.slice_index, store.slice_index[10:20])
    assert slice_share(None, rank=0, world=2) is None
    with pytest.raises(ValueError, match=r"^labelled slices: 3 slices cannot be shared by 4 processes"):
        slice_share(synthetic_store(depths=(3,)), what="labelled slices", rank=0, world=4)


def _batches(sampler, n=4):
    it = iter(sampler)
    return [next(it) for _ in range(n)]


@pytest.mark.parametrize("sampler", ["partition", "random"])
def test_the_streamed_store_gives_the_same_batches_as_the_store_on_the_device(sampler):
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    base = synthetic_store()
    stores = {"device": base.placed(device, "device"), "host": base.placed(device, "host")}
    assert stores["device"].stream is None and stores["host"].stream is not None
    assert stores["host"].image.device.type == "cpu"
    make = {"partition": lambda s, g: PartitionBatchSampler(s, scans_per_batch=2, generator=g),
            "random": lambda s, g: RandomSliceSampler(s, batch_size=5, generator=g)}[sampler]
    runs = {k: _batches(make(s, torch.Generator().manual_seed(3))) for k, s in stores.items()}
    for on_device, streamed in zip(runs["device"], runs["host"]):
        assert on_device.keys() == streamed.keys()
        for key in on_device:
            assert streamed[key].device == on_device[key].device
            assert torch.equal(streamed[key], on_device[key]), key


@pytest.mark.parametrize("dtype, shape", [(torch.float32, (30, 1, 9, 7)), (torch.uint8, (30, 1, 4, 4)),
                                          (torch.int64, (30,)), (torch.bfloat16, (30, 2, 3))])
def test_gather_rows_is_index_select_row_by_row(dtype, shape):
    # bfloat16 has no NumPy twin: index_select itself; repeated and unsorted indices, the first and the last row
    src = (torch.randn(shape, generator=torch.Generator().manual_seed(0)) * 100).to(dtype)
    idx = torch.tensor([29, 0, 7, 7, 13, 0])
    out = torch.empty((len(idx), *shape[1:]), dtype=dtype)
    assert gather_rows(src, idx, out) is out and torch.equal(out, torch.index_select(src, 0, idx))
    empty = torch.empty((0, *shape[1:]), dtype=dtype)
    assert gather_rows(src, idx[:0], empty).shape == empty.shape
    for bad in (torch.tensor([3, 30]), torch.tensor([-1, 3])):  # NumPy would take row -1 (the last) silently
        with pytest.raises(IndexError, match="gather_rows: indices"):
            gather_rows(src, bad, out[:2])


def test_host_to_device_gathers_into_staging_buffers_kept_per_slot():
    store = synthetic_store()
    mover = HostToDevice("cpu")
    sources = {"image": store.image, "label": store.label, "scan": store.scan_index}
    idx = torch.tensor([3, 1, 29])
    staged = mover.gather(sources, idx, slot=1)
    for key, src in sources.items():
        assert torch.equal(staged[key], src[idx]), key
    again = mover.gather(sources, torch.tensor([0, 2, 4]), slot=1)
    assert all(again[k].data_ptr() == staged[k].data_ptr() for k in sources)  # allocated once per slot and key
    other = mover.gather(sources, idx, slot=2)
    assert all(other[k].data_ptr() != staged[k].data_ptr() for k in sources)


def test_the_device_path_draws_what_it_drew_before_the_host_path_existed():
    """The samplers' one-process batches for a seed: the same random calls, in the same order, as before."""
    store = synthetic_store()
    g = torch.Generator().manual_seed(5)
    batch = next(iter(RandomSliceSampler(store, batch_size=4, generator=g)))
    idx = torch.randint(0, store.num_slices, (4,), generator=torch.Generator().manual_seed(5))
    assert torch.equal(batch["image"], store.image[idx]) and torch.equal(batch["label"], store.label[idx])
    sampler = PartitionBatchSampler(store, scans_per_batch=2, generator=torch.Generator().manual_seed(5))
    g = torch.Generator().manual_seed(5)
    scans = torch.randperm(5, generator=g)[:2]
    u = torch.rand(2, 3, generator=g)
    expected = (sampler.start[scans] + (u * sampler.count[scans]).long().clamp_max(sampler.count[scans] - 1)).flatten()
    assert torch.equal(next(iter(sampler))["image"], store.image[expected])


def test_placement_follows_the_budget_and_can_be_forced(caplog, monkeypatch):
    gb = 1e9
    assert choose_placement(2 * gb, "cpu") == choose_placement(2 * gb, "cpu", "auto", 1) == "device"  # host = device
    assert choose_placement(2 * gb, "cpu", "host") == "host"
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10 * gb, 80 * gb))
    assert memory_budget_bytes("cuda:0") == 5 * gb  # auto: half the free memory
    with caplog.at_level(logging.INFO, logger="bim"):
        assert choose_placement(4 * gb, "cuda:0") == "device"
        assert choose_placement(6 * gb, "cuda:0") == "host"
        assert choose_placement(6 * gb, "cuda:0", "auto", 8) == "device"
        assert choose_placement(6 * gb, "cuda:0", "device") == "device"
    assert "slice store of 6.00 GB (budget 5.00 GB, half the free memory of cuda:0): kept in host memory" in caplog.text
    with pytest.raises(ValueError, match=r"^data_store must be one of \('auto', 'device', 'host'\), got 'gpu'"):
        choose_placement(1, "cuda:0", "gpu")
    for bad in (0, -1, "lots", True):
        with pytest.raises(ValueError, match=r"^data_memory_budget_gb must be 'auto' or a positive number of GB"):
            choose_placement(1, "cuda:0", "device", bad)


def test_the_pretraining_bundle_places_its_store_as_data_store_says(demo_dataset, tmp_path):
    from bundle_helpers import workflow

    stores = {}
    for choice in ("auto", "host"):
        wf = workflow("pretrain_bim", "train.json", dataset_dir=str(demo_dataset), output_dir=str(tmp_path),
                      data_store=choice, data_memory_budget_gb=0.001, progress_bar=False)
        stores[choice] = wf.parser.get_parsed_content("train#store")
    assert stores["auto"].stream is None  # a CPU run: the host is the device, no budget applies
    assert stores["host"].stream is not None and torch.equal(stores["host"].image, stores["auto"].image)
