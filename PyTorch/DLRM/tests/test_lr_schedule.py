import pytest

from dlrm.utils.lr_schedule import LearningRateSchedule


def test_seed_log_value_and_phases():
    s = LearningRateSchedule(28.0, warmup_steps=6400, decay_start_step=64000, decay_steps=80000)
    # The seed's printed log: "[200/128028] ... lr: 0.8794", "[400/...] lr: 1.7544", "[2200/...] lr: 9.6294".
    assert round(s.lr_at(201), 4) == 0.8794
    assert round(s.lr_at(401), 4) == 1.7544
    assert round(s.lr_at(2201), 4) == 9.6294
    assert s.lr_at(1) == pytest.approx(28 / 6400)
    assert s.lr_at(6400) == 28.0 and s.lr_at(6401) == 28.0 and s.lr_at(64000) == 28.0
    assert s.lr_at(64000 + 40000) == pytest.approx(28.0 * 0.5 ** 2)  # half-way through the decay, power 2
    assert s.lr_at(144000) == 0.0 and s.lr_at(10 ** 7) == 0.0


def test_warmup_factor_starts_higher():
    s = LearningRateSchedule(1.0, warmup_steps=100, warmup_factor=1, decay_steps=0)
    assert s.lr_at(0) == pytest.approx(0.5)
    assert s.lr_at(50) == pytest.approx(0.75)
    assert s.lr_at(100) == 1.0 and s.lr_at(10 ** 6) == 1.0  # decay_steps 0: no decay


def test_decay_defaults_to_after_warmup_and_end_lr_floor():
    s = LearningRateSchedule(2.0, warmup_steps=10, decay_start_step=None, decay_steps=10, decay_power=1.0, end_lr=0.5)
    assert s.lr_at(10) == 2.0
    assert s.lr_at(15) == pytest.approx(1.0)
    assert s.lr_at(19) == pytest.approx(0.5)   # 0.2 would be below end_lr
    assert s.lr_at(25) == 0.5


def test_invalid_schedules_are_rejected():
    with pytest.raises(ValueError, match="warmup must finish before decay"):
        LearningRateSchedule(1.0, warmup_steps=100, decay_start_step=50, decay_steps=10)
    with pytest.raises(ValueError, match="non-negative integer"):
        LearningRateSchedule(1.0, warmup_factor=-1)


def test_apply_sets_every_group():
    import torch
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=99.0)
    lr = LearningRateSchedule(4.0, warmup_steps=4).apply([opt], 2)
    assert lr == 2.0 and opt.param_groups[0]["lr"] == 2.0
