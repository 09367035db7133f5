//! The recurrent-state cache: the fixed-size per-sequence state that linear-attention and
//! state-space layers (Gated DeltaNet, Mamba-2, short convolutions) keep instead of paged K/V.
//! Which slot belongs to which sequence is the KV cache manager's business
//! (`tokenmill-core`); this is only the storage the model reads and writes, held inside
//! [`crate::KvCacheStorage`] so every forward signature stays the same.
//!
//! A model with recurrent layers reports one [`LayerStateLayout`] per recurrent layer
//! ([`crate::CausalLm::state_layout`]) and only its attention layers in
//! [`crate::CausalLm::kv_layout`]; the step gives each sequence its slot in
//! [`crate::BatchInput::state_slots`].

/// What one recurrent layer keeps per sequence, in f32 elements: the causal convolution's
/// window of past inputs and the recurrent (DeltaNet / SSM) state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerStateLayout {
    pub conv_elems: usize,
    pub recurrent_elems: usize,
}

impl LayerStateLayout {
    /// Bytes one sequence's state of this layer occupies.
    pub fn bytes(&self) -> usize {
        (self.conv_elems + self.recurrent_elems) * std::mem::size_of::<f32>()
    }
}

/// Per recurrent layer, `num_slots` slots of its convolution and recurrent state (f32,
/// `[num_slots][elems]`, zeroed at allocation). Empty for models without recurrent layers.
#[derive(Debug, Default)]
pub struct StateCacheStorage {
    layout: Vec<LayerStateLayout>,
    conv: Vec<Vec<f32>>,
    recurrent: Vec<Vec<f32>>,
    num_slots: usize,
}

impl StateCacheStorage {
    /// Allocates (zeroed) `num_slots` slots for each layer of `layout`.
    pub fn new(layout: &[LayerStateLayout], num_slots: usize) -> StateCacheStorage {
        StateCacheStorage {
            layout: layout.to_vec(),
            conv: layout
                .iter()
                .map(|layer| vec![0.0; layer.conv_elems * num_slots])
                .collect(),
            recurrent: layout
                .iter()
                .map(|layer| vec![0.0; layer.recurrent_elems * num_slots])
                .collect(),
            num_slots,
        }
    }

    /// Bytes one slot occupies over all layers of `layout`: what a memory budget divides by.
    pub fn bytes_per_slot(layout: &[LayerStateLayout]) -> usize {
        layout
            .iter()
            .map(LayerStateLayout::bytes)
            .fold(0, usize::saturating_add)
    }

    pub fn num_slots(&self) -> usize {
        self.num_slots
    }

    /// Recurrent layers held.
    pub fn num_layers(&self) -> usize {
        self.layout.len()
    }

    pub fn layout(&self) -> &[LayerStateLayout] {
        &self.layout
    }

    /// Recurrent layer `layer`'s convolution and recurrent state of `slot`, mutable; `None`
    /// when either is out of range.
    pub fn slot_mut(&mut self, layer: usize, slot: usize) -> Option<(&mut [f32], &mut [f32])> {
        if slot >= self.num_slots {
            return None;
        }
        let shape = *self.layout.get(layer)?;
        let conv = self.conv.get_mut(layer)?;
        let recurrent = self.recurrent.get_mut(layer)?;
        let conv = conv.get_mut(slot * shape.conv_elems..(slot + 1) * shape.conv_elems)?;
        let recurrent =
            recurrent.get_mut(slot * shape.recurrent_elems..(slot + 1) * shape.recurrent_elems)?;
        Some((conv, recurrent))
    }

    /// Recurrent layer `layer`'s convolution and recurrent state of each of `slots` at once
    /// (one step's sequences), in the order given; `None` when the layer or a slot is out
    /// of range or a slot is named twice.
    pub fn slots_mut(
        &mut self,
        layer: usize,
        slots: &[u32],
    ) -> Option<Vec<(&mut [f32], &mut [f32])>> {
        let shape = *self.layout.get(layer)?;
        let conv = self.conv.get_mut(layer)?;
        let recurrent = self.recurrent.get_mut(layer)?;
        let mut all: Vec<Option<(&mut [f32], &mut [f32])>> = if shape.conv_elems == 0 {
            recurrent
                .chunks_exact_mut(shape.recurrent_elems.max(1))
                .map(|r| Some((&mut [][..], r)))
                .collect()
        } else {
            conv.chunks_exact_mut(shape.conv_elems)
                .zip(recurrent.chunks_exact_mut(shape.recurrent_elems.max(1)))
                .map(|(c, r)| Some((c, r)))
                .collect()
        };
        slots
            .iter()
            .map(|&slot| all.get_mut(slot as usize).and_then(Option::take))
            .collect()
    }

    /// Zeroes `slot` in every layer: a sequence whose run starts at position 0 starts from
    /// here (a model does this itself for such a sequence before reading its state).
    pub fn reset_slot(&mut self, slot: usize) {
        for layer in 0..self.layout.len() {
            if let Some((conv, recurrent)) = self.slot_mut(layer, slot) {
                conv.fill(0.0);
                recurrent.fill(0.0);
            }
        }
    }

    /// Copies `from`'s state into `to` in every layer (a prefix-cache checkpoint restore or a
    /// speculative rollback copy); nothing when either is out of range or they are equal.
    pub fn copy_slot(&mut self, from: usize, to: usize) {
        if from == to || from >= self.num_slots || to >= self.num_slots {
            return;
        }
        for (layer, shape) in self.layout.iter().enumerate() {
            let copy = |buffer: &mut Vec<f32>, elems: usize| {
                buffer.copy_within(from * elems..(from + 1) * elems, to * elems);
            };
            copy(&mut self.conv[layer], shape.conv_elems);
            copy(&mut self.recurrent[layer], shape.recurrent_elems);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_separate_per_layer_and_reset_or_copy_in_every_layer() {
        let layout = [
            LayerStateLayout {
                conv_elems: 3,
                recurrent_elems: 4,
            },
            LayerStateLayout {
                conv_elems: 2,
                recurrent_elems: 5,
            },
        ];
        assert_eq!(StateCacheStorage::bytes_per_slot(&layout), (7 + 7) * 4);
        let mut state = StateCacheStorage::new(&layout, 3);
        assert_eq!((state.num_slots(), state.num_layers()), (3, 2));
        for (layer, shape) in layout.iter().enumerate() {
            for slot in 0..3 {
                let (conv, recurrent) = state.slot_mut(layer, slot).unwrap();
                assert_eq!(conv.len(), shape.conv_elems);
                assert_eq!(recurrent.len(), shape.recurrent_elems);
                conv.fill((10 * layer + slot) as f32);
                recurrent.fill((100 + 10 * layer + slot) as f32);
            }
        }
        assert!(state.slot_mut(2, 0).is_none());
        {
            let both = state.slots_mut(1, &[2, 0]).unwrap();
            assert_eq!(both[0].0[0], 12.0);
            assert_eq!(both[1].1[0], 110.0);
        }
        assert!(state.slots_mut(0, &[1, 1]).is_none());
        assert!(state.slots_mut(0, &[3]).is_none());
        assert!(state.slot_mut(0, 3).is_none());
        state.copy_slot(2, 0);
        state.reset_slot(1);
        for layer in 0..2 {
            let (conv, recurrent) = state.slot_mut(layer, 0).unwrap();
            assert!(conv.iter().all(|&v| v == (10 * layer + 2) as f32));
            assert!(recurrent
                .iter()
                .all(|&v| v == (100 + 10 * layer + 2) as f32));
            let (conv, recurrent) = state.slot_mut(layer, 1).unwrap();
            assert!(conv.iter().chain(recurrent.iter()).all(|&v| v == 0.0));
            let (conv, _) = state.slot_mut(layer, 2).unwrap();
            assert!(conv.iter().all(|&v| v == (10 * layer + 2) as f32));
        }
    }
}
