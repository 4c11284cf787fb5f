//! GGUF container: header, metadata, tensor infos.
