//! gradient_ghost's exploding-layer measure: each layer's second moments
//! against the same tensors in its nearest layers, on a log scale.
//!
//! Why it is built this way (the peers, the two highest set aside, the
//! share of tensors, the thresholds measured on healthy runs) is told in
//! `python/adapterprobe/probes/layer_lift.py`, which keeps the constants
//! and the small helpers under the same names.

use std::collections::{BTreeMap, HashMap};

use crate::analysis::attribution::Attribution;
use crate::analysis::numerics::median;
use crate::store::torch_state::ParamStat;

/// A layer's peers: this many other layers, the nearest in depth.
pub const PEERS: usize = 4;
/// The peers' highest values set aside when forming a tensor's reference:
/// one other exploding layer and one naturally busy layer.
pub const SET_ASIDE: usize = 2;
/// The block that reads the embeddings: busier than its peers in healthy
/// runs, so it gets its own threshold.
pub const FIRST_LAYER: u64 = 0;

/// One layer's lift over its peers' reference, in decades.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerLift {
    pub layer: u64,
    /// Reached by at least `share` of its tensors.
    pub decades: f64,
    /// Tensors compared.
    pub tensors: usize,
    /// (tensor, lift in decades), highest first.
    pub by_tensor: Vec<(String, f64)>,
}

/// The [`PEERS`] other layers nearest to `layer` in depth (the lower one
/// first on a tie): every other layer in models of up to `PEERS + 1`.
pub fn nearest_peers(layer: u64, layers: &[u64]) -> Vec<u64> {
    let mut others: Vec<u64> = layers.iter().copied().filter(|&m| m != layer).collect();
    others.sort_by_key(|&m| (m.abs_diff(layer), m));
    others.truncate(PEERS);
    others
}

/// The median of `others` (the same tensor's log10 values in the peer
/// layers) without their [`SET_ASIDE`] highest values, at least the lowest
/// kept. NaN values are left out; NaN for none.
pub fn peer_reference(others: &[f64]) -> f64 {
    let mut ordered: Vec<f64> = others.iter().copied().filter(|v| !v.is_nan()).collect();
    ordered.sort_by(f64::total_cmp);
    let keep = ordered.len().saturating_sub(SET_ASIDE).max(1);
    ordered.truncate(keep);
    median(ordered).unwrap_or(f64::NAN)
}

/// The largest value that at least `share` of `lifts` reach. NaN for none.
pub fn share_quantile(lifts: &[f64], share: f64) -> f64 {
    let mut ordered = lifts.to_vec();
    // Descending and stable (a total order).
    ordered.sort_by(|a, b| b.total_cmp(a));
    let wanted = (share * ordered.len() as f64 - 1e-9).ceil();
    // `wanted` is at most len (share <= 1); the float-to-int cast saturates.
    let reached_by = if wanted >= 1.0 { wanted as usize } else { 1 };
    ordered
        .get(reached_by.saturating_sub(1))
        .copied()
        .unwrap_or(f64::NAN)
}

/// Each layer's lift over its peers, in layer order.
///
/// A tensor (attribution slot) is compared where it holds a positive,
/// finite second moment in at least `min_layers` layers (tensors with none
/// are dead: the caller reports them); a layer with no compared tensor gets
/// no lift. Attributed ids the state does not hold are passed over.
pub fn layer_lifts(
    per_param: &[ParamStat],
    attribution: &Attribution,
    share: f64,
    min_layers: usize,
) -> Vec<LayerLift> {
    let value: HashMap<i64, f64> = per_param
        .iter()
        .map(|p| (p.param_id, p.exp_avg_sq_mean))
        .collect();
    // slot -> [(layer, log10 value)] in first-seen order (a dict's).
    let mut by_slot: BTreeMap<u64, Vec<(u64, f64)>> = BTreeMap::new();
    for ps in &attribution.params {
        let Some(&v) = value.get(&ps.param_id) else {
            continue;
        };
        if v > 0.0 && v.is_finite() {
            let logs = by_slot.entry(ps.slot).or_default();
            let x = v.log10();
            match logs.iter_mut().find(|(layer, _)| *layer == ps.layer) {
                Some(entry) => entry.1 = x,
                None => logs.push((ps.layer, x)),
            }
        }
    }
    let mut per_layer: BTreeMap<u64, Vec<(String, f64)>> = BTreeMap::new();
    for (&slot, logs) in &by_slot {
        if logs.len() < min_layers {
            continue;
        }
        let tensor = slot_name(attribution, slot);
        let layers: Vec<u64> = logs.iter().map(|&(layer, _)| layer).collect();
        for &(layer, x) in logs {
            let others: Vec<f64> = nearest_peers(layer, &layers)
                .iter()
                .filter_map(|m| logs.iter().find(|(l, _)| l == m).map(|&(_, v)| v))
                .collect();
            per_layer
                .entry(layer)
                .or_default()
                .push((tensor.clone(), x - peer_reference(&others)));
        }
    }
    per_layer
        .into_iter()
        .map(|(layer, mut lifts)| {
            let values: Vec<f64> = lifts.iter().map(|&(_, d)| d).collect();
            // Highest first; equal lifts keep their order (a stable sort).
            lifts.sort_by(|a, b| b.1.total_cmp(&a.1));
            LayerLift {
                layer,
                decades: share_quantile(&values, share),
                tensors: lifts.len(),
                by_tensor: lifts,
            }
        })
        .collect()
}

/// What a slot is called in messages: its key suffixes, or `slot N`.
pub fn slot_name(attribution: &Attribution, slot: u64) -> String {
    match usize::try_from(slot)
        .ok()
        .and_then(|i| attribution.slot_names.get(i))
    {
        Some(name) if !name.is_empty() => name.clone(),
        _ => format!("slot {slot}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::attribution::ParamSlot;

    #[test]
    fn peers_are_the_nearest_lower_first() {
        assert_eq!(nearest_peers(3, &[0, 1, 2, 3, 4, 5, 6]), vec![2, 4, 1, 5]);
        assert_eq!(nearest_peers(0, &[0, 2, 4]), vec![2, 4]);
    }

    #[test]
    fn reference_and_quantile_match_the_python_helpers() {
        // The cases of tests/test_ghost_layers.py.
        assert_eq!(peer_reference(&[0.0]), 0.0);
        assert_eq!(peer_reference(&[0.0, 5.0]), 0.0);
        assert_eq!(peer_reference(&[0.0, 9.0, 5.0]), 0.0);
        assert_eq!(peer_reference(&[3.0, 0.0, 9.0, 1.0, 5.0]), 1.0);
        assert_eq!(share_quantile(&[3.0, 1.0, 2.0, 0.0], 0.9), 0.0);
        let twenty: Vec<f64> = (0..20).map(f64::from).collect();
        assert_eq!(share_quantile(&twenty, 0.9), 2.0);
        assert_eq!(share_quantile(&[1.0], 0.5), 1.0);
        assert!(share_quantile(&[], 0.5).is_nan());
    }

    fn stat(param_id: i64, exp_avg_sq_mean: f64) -> ParamStat {
        ParamStat {
            param_id,
            numel: 1,
            shape: vec![1],
            exp_avg_sq_mean,
            nonfinite: 0,
        }
    }

    #[test]
    fn an_exploding_layer_lifts_every_tensor() {
        // 5 layers x 2 slots; layer 2 is 100x (2 decades) in both tensors.
        let mut per_param = Vec::new();
        let mut params = Vec::new();
        for layer in 0..5u64 {
            for slot in 0..2u64 {
                let id = i64::try_from(layer * 2 + slot).unwrap_or(0);
                let v = if layer == 2 { 1e-4 } else { 1e-6 };
                per_param.push(stat(id, v));
                params.push(ParamSlot {
                    param_id: id,
                    layer,
                    slot,
                });
            }
        }
        let attribution = Attribution {
            layer_indices: (0..5).collect(),
            params,
            slot_names: vec!["q.lora_A".into(), String::new()],
            unattributed: vec![],
        };
        let lifts = layer_lifts(&per_param, &attribution, 0.9, 3);
        assert_eq!(lifts.len(), 5);
        let hot = lifts.iter().find(|x| x.layer == 2);
        assert!(hot.is_some_and(|x| (x.decades - 2.0).abs() < 1e-12 && x.tensors == 2));
        assert!(hot.is_some_and(|x| x.by_tensor.iter().any(|(t, _)| t == "slot 1")));
        assert!(lifts
            .iter()
            .filter(|x| x.layer != 2)
            .all(|x| x.decades.abs() < 1e-12));
        // Too few layers per tensor: nothing compared.
        assert!(layer_lifts(&per_param, &attribution, 0.9, 6).is_empty());
    }
}
