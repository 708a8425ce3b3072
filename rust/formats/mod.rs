//! One module per file format: bytes in, typed values out, no judging.
//!
//! What belongs here: parsers of the files a training run leaves behind
//! (safetensors headers, shard indexes and tensor data, PEFT's `adapter_config.json`, a model's `config.json`, the
//! allow-listed pickle interpreter and `torch.save` archives, and the
//! training logs under [`logs`]). A reader checks every size it is given
//! against the file and a cap, and reports bad input as an `Error`; what a
//! value *means* for a run's health is decided in `analysis` and `store`.
//! Modules here depend only on `io` and on each other.

pub mod adapter_config;
pub mod kohya_metadata;
pub mod logs;
pub mod lora_keys;
pub mod mlx_config;
pub mod model_config;
pub mod pickle;
pub mod safetensors_header;
pub mod safetensors_index;
pub mod tensor_data;
pub mod tensor_view;
pub mod torch_save;
pub mod torch_state_dict;
