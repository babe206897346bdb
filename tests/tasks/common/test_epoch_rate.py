"""A run's seconds per epoch and samples per second, from its epochs' times and samples (the one loop's summary)."""

import pytest

from tasks.common.runtimes.loop import History, epoch_rate, summary

EPOCH = 800  # samples in a whole epoch


def test_whole_epochs_give_the_median_without_the_first():
    history = History(epoch_s=[9.0, 2.0, 4.0, 2.5], epoch_samples=[EPOCH] * 4)
    assert epoch_rate(history, EPOCH) == (2.5, EPOCH / 2.5)


def test_an_epoch_cut_short_counts_its_own_samples_not_a_whole_epochs():
    # a step limit inside the first epoch: 120 samples in 3 s is 40 samples/s, not 800 / 3
    assert epoch_rate(History(epoch_s=[3.0], epoch_samples=[120]), EPOCH) == (20.0, 40.0)
    # a time budget that cut the last epoch short: the whole epochs after the first decide
    assert epoch_rate(History(epoch_s=[9.0, 4.0, 1.0], epoch_samples=[EPOCH, EPOCH, 100]), EPOCH) == (4.0, 200.0)
    # no whole epoch after the first: their samples over their seconds
    seconds, rate = epoch_rate(History(epoch_s=[9.0, 1.0], epoch_samples=[EPOCH, 100]), EPOCH)
    assert (seconds, rate) == (8.0, 100.0)


def test_a_checkpoint_from_before_epochs_were_counted_reads_its_epochs_as_whole():
    # resumed from such a checkpoint after two epochs, then one more epoch cut short
    history = History(epoch_s=[9.0, 4.0, 1.0], epoch_samples=[100])
    assert epoch_rate(history, EPOCH) == (4.0, 200.0)


def test_the_summary_reports_the_rate():
    history = History(epoch=1, epoch_s=[3.0], epoch_samples=[120], global_step=15, train_s=3.2, samples=120)
    s = summary(history, EPOCH, "step limit")
    assert s.samples_per_s == pytest.approx(40.0) and s.time_per_epoch_s == pytest.approx(20.0) and s.ended_by == "step limit"
