//! Pure computation on typed values: statistics, curve analysis, layers.
//!
//! What belongs here: kernels that take what `formats` read (a loss curve,
//! tensor bytes, an optimizer graph, tensor names) and compute numbers from
//! it — curve metrics and the robust spike analysis, float reductions,
//! second-moment statistics, attribution of tensors to layers, LoRA weight
//! statistics and a full model's weight norms. No directory walking and no
//! store layouts (that is `store`).

pub mod adam_bound;
pub mod adapter_weights;
pub mod attribution;
pub mod float_reduce;
pub mod full_weights;
pub mod layers;
pub mod metrics;
pub mod numerics;
pub mod robust_curve;
pub mod second_moment;
pub mod series;
pub mod update_similarity;
