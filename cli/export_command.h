// `cohort export`: a GPT's weights in the layouts other tools read (issue 32).
//
//   cohort export --format hf CHECKPOINT OUT_DIR            HuggingFace: OUT_DIR/model.safetensors, config.json
//   cohort export --format hf CHECKPOINT OUT.safetensors    the safetensors file alone
//   cohort export --format llmc [--dtype bf16] CHECKPOINT OUT.bin   llm.c's model file (version 3, or 5 for bf16)
//
// CHECKPOINT is anything --init-from reads (nn/model_weights.h): a Cohort checkpoint of a gpt: model,
// or another tool's GPT-2 file, so the command converts between the three. The layouts are nn/gpt_files.h's;
// in fp32 the weights go out bit for bit, and `cohort train --init-from OUT` reads them back bit for bit.
// Files are written atomically. Exit 2 with one line for a missing or malformed input, a model other
// than a gpt:, a bad --format or --dtype, or an output that cannot be written.
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace cohort::cli {

struct ExportFlags {
  std::string format;  // hf | llmc
  std::string dtype = "fp32";
  std::string checkpoint;
  std::string out;
};

void addExportFlags(CLI::App& command, ExportFlags& flags);
int runExport(const ExportFlags& flags);

}  // namespace cohort::cli
