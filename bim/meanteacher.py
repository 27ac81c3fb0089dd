"""The semi-supervised trainer: one Ignite/MONAI engine for Mean Teacher and the paper's baselines."""

from __future__ import annotations

from ignite.engine import Engine, Events
from monai.engines import SupervisedTrainer
from monai.utils import CommonKeys as Keys

from .engine import unwrap
from .semi_supervised import SemiSupervisedMethod, check_method


class SemiSupervisedTrainer(SupervisedTrainer):
    """One iteration, all on the device: the :class:`~bim.semi_supervised.PairedSliceSampler` gives a
    labelled and an unlabelled batch of full slices; ``step``, a :class:`~bim.semi_supervised.SemiSupervisedMethod`,
    builds the views, runs the student (and the teacher / discriminator of the method), steps the optimisers and
    updates the EMA teacher. ``method`` is the bundle's key of that name: it must name ``step``'s class in
    :data:`~bim.semi_supervised.METHODS` (a ``ValueError`` naming the key and the known methods otherwise). The LR
    schedule is stepped per iteration by an ``LrScheduleHandler``.

    The engine output holds ``loss`` (total), ``image``/``label``/``pred`` of the labelled student view and
    ``terms`` (``loss_sup``, ``loss_reg``, the ramped ``weight``, and per method ``threshold``,
    ``certain_fraction`` (UA-MT) or ``loss_disc`` (adversarial)) as Python floats-to-be (0-d tensors).

    ``_iteration`` is overridden, as MONAI's one forward + loss + step cannot express a step of several forwards
    (labelled and unlabelled batches, the teacher's), two optimisers (adversarial) and the teacher's EMA update."""

    def __init__(self, *args, step: SemiSupervisedMethod, method: str, **kwargs) -> None:
        check_method(method, step)
        kwargs.setdefault("decollate", False)
        super().__init__(*args, **kwargs)
        self.ssl_step = step
        # after the train handlers: a handler that loads the student's weights at start (MONAI Label's
        # CheckpointLoader of model.pt) has run, and a resumed run has its iteration back
        self.add_event_handler(Events.STARTED, self.teacher_starts_as_student)

    def teacher_starts_as_student(self, engine: Engine) -> None:
        """A fresh run's teacher starts as the student is when training starts, so weights loaded into the student by
        a start-up handler reach the teacher too; a resumed run (iteration > 0) keeps its checkpointed teacher."""
        teacher = getattr(self.ssl_step, "teacher", None)
        if teacher is not None and engine.state.iteration == 0:
            teacher.module.load_state_dict(unwrap(engine.network).state_dict())

    def _iteration(self, engine, batchdata: dict) -> dict:
        out = self.ssl_step(engine.network, batchdata, engine.state.iteration - 1)
        terms = {k: v for k, v in out.items() if k not in ("image", "label", "pred", "loss")}
        return {Keys.LOSS: out["loss"], Keys.IMAGE: out["image"], Keys.LABEL: out["label"],
                Keys.PRED: out["pred"].detach(), "terms": terms}
