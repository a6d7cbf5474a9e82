"""[tf] The tf engine's gradient accumulation: a Keras model that updates once per N micro-batches.

Its training step adds up ``accumulation_steps`` micro-batches' gradients and updates once, as Horovod's
``backward_passes_per_step`` does. Split from app.engines.tfdist, which makes the model one
(``prepare_model``).
"""

from __future__ import annotations


def _tf():
    import tensorflow as tf

    return tf


class _Sums:
    """The accumulated gradients, out of Keras's sight: one local variable per trainable weight.

    A plain object: not tracked, so never in a checkpoint, and never read across ranks.
    """

    def __init__(self, variables):
        tf = _tf()
        on_read, add = tf.VariableSynchronization.ON_READ, tf.VariableAggregation.SUM
        self.sums = [
            tf.Variable(tf.zeros_like(v), trainable=False, synchronization=on_read, aggregation=add)
            for v in variables
        ]


def accumulating_class():
    """The Keras model class whose training step accumulates ``accumulation_steps`` passes per update.

    As Horovod's ``backward_passes_per_step`` does: the mean of the micro-batches' gradients, then one update
    (all-reduced across the ranks).
    """
    tf = _tf()

    class AccumulatingModel(tf.keras.Model):
        accumulation_steps = 1

        def train_step(self, data):
            x, y = data[0], data[1]
            optimizer = self.optimizer
            scaled = isinstance(optimizer, tf.keras.mixed_precision.LossScaleOptimizer)
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(x, y, y_pred, None)
                target = optimizer.get_scaled_loss(loss) if scaled else loss
            grads = tape.gradient(target, self.trainable_variables)
            if scaled:
                grads = optimizer.get_unscaled_gradients(grads)
            k = float(self.accumulation_steps)
            for total, grad in zip(self._sums.sums, grads, strict=True):
                total.assign_add(tf.cast(grad, total.dtype) / k)
            # a Python flag: each value is its own compiled step (see make_train_function)
            if self._apply_now:
                optimizer.apply_gradients(
                    zip([t.read_value() for t in self._sums.sums], self.trainable_variables, strict=True)
                )
                for total in self._sums.sums:
                    total.assign(tf.zeros_like(total))
            return self.compute_metrics(x, y, y_pred, None)

        def make_train_function(self, force=False):
            """Two compiled steps, accumulate and accumulate-then-update, chosen per batch in Python.

            The update all-reduces, and MWMS allows no collective inside a tf.cond.
            """
            if self.train_function is not None and not force:
                return self.train_function
            if getattr(self, "_sums", None) is None:
                with self.distribute_strategy.scope():
                    self._sums = _Sums(self.trainable_variables)
            steps = {}
            for apply_now in (False, True):
                self.train_function, self._apply_now = None, apply_now
                steps[apply_now] = super().make_train_function(force=True)
            # backward passes since this function was made: each model.fit starts on an update boundary
            count = [0]

            def train_function(iterator):
                count[0] += 1
                self._apply_now = count[0] % self.accumulation_steps == 0  # read when a step is traced
                logs = steps[self._apply_now](iterator)
                if not self._apply_now:
                    # Horovod's backward_passes_per_step counts every backward pass in optimizer.iterations
                    # (its aggregation helper adds 1 where it skips the update); so does this engine, so a
                    # checkpoint means the same on both. Outside the step, in cross-replica context: each
                    # local copy is updated, with no collective.
                    self.optimizer.iterations.assign_add(1)
                return logs

            self.train_function = train_function
            return train_function

    return AccumulatingModel
