// A model with two encoders, for planner tests: a CLIP ViT-L and a Whisper-large-v3 encoder,
// each with its own projector, feeding Qwen2.5-7B. The scenario's "model" value as JSON.
#pragma once

namespace hetpar::planner {

inline constexpr const char* kTwoEncoderModel = R"({"name": "clip-whisper-qwen", "modules": [
    {"name": "vision", "kind": "vision_encoder", "spec": "clip-vit-l-14-336"},
    {"name": "vproj", "kind": "projector", "spec": {"input_hidden": 1024,
     "output_hidden": 3584, "layers": 2, "ffn_hidden": 3584}},
    {"name": "audio", "kind": "audio_encoder", "spec": "whisper-large-v3-encoder"},
    {"name": "aproj", "kind": "projector", "spec": {"input_hidden": 1280,
     "output_hidden": 3584, "layers": 2, "ffn_hidden": 3584}},
    {"name": "llm", "kind": "llm", "spec": "qwen2.5-7b"}],
   "edges": [["vision", "vproj"], ["vproj", "llm"], ["audio", "aproj"], ["aproj", "llm"]]})";

}  // namespace hetpar::planner
