//! Writes a fixture's formula weights as `model.safetensors`: the step the cross-encoder and
//! decoder-embedder fixtures share (`#[path]`-included by their support files).

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::TensorView;
use serde_json::Value;

/// Writes `dir/model.safetensors` holding every tensor of `tensors` (name → shape, as the
/// fixtures store them) as F32 values `weight(name, shape)`.
#[allow(clippy::unwrap_used)]
pub fn write_safetensors(tensors: &Value, dir: &Path, weight: impl Fn(&str, &[usize]) -> Vec<f32>) {
    let shapes: Vec<(String, Vec<usize>)> = tensors
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, shape)| {
            let shape = shape
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap() as usize);
            (name.clone(), shape.collect())
        })
        .collect();
    let bytes: HashMap<&str, Vec<u8>> = shapes
        .iter()
        .map(|(name, shape)| {
            let values = weight(name, shape);
            (
                name.as_str(),
                values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            )
        })
        .collect();
    let views: Vec<(&str, TensorView<'_>)> = shapes
        .iter()
        .map(|(name, shape)| {
            let view = TensorView::new(
                safetensors::Dtype::F32,
                shape.clone(),
                &bytes[name.as_str()],
            )
            .unwrap();
            (name.as_str(), view)
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
}
