// ParamBuffer: every parameter of a model as a view into one contiguous float32 buffer, in forward
// order, and every gradient as a view into a second buffer of the same layout
// (docs/architecture.md, "The decisions that shape everything", item 1). A third flat buffer holds
// the model's non-trainable state ("buffers" in PyTorch's sense, e.g. BatchNorm's running
// statistics): saved in checkpoints like parameters, but never touched by optimizers or gradient
// synchronisation, and always in this process's private memory.
//
// Two phases. Registration: modules call add() with a name, a shape and the addresses of the Tensor
// members that will view the value and the gradient, and addBuffer() for state. Binding: allocate()
// (owned memory) or attach() (parameters in memory owned by someone else, e.g. a shared-memory
// segment for Hogwild; gradients and buffers stay private) creates the flat buffers and points every
// registered Tensor into them. After binding the layout is frozen: add() and addBuffer() throw.
// Parameter and buffer names share one namespace (checkpoints store both under their names). The
// registered Tensor members must outlive the binding (modules register their own members, and a
// model owns both the modules and its ParamBuffer).
//
// Units: the parameters cut into named, contiguous runs of entries that a model computes with as
// one piece — a transformer block, a top-level layer of a Sequential, the GPT's embeddings, a group
// the library user names. A composite declares one around a child's registration:
//   params.beginUnit(prefix + "h.3");
//   block.registerParams(params, prefix + "h.3.");
//   std::optional<ParamBuffer::Unit> unit = params.endUnit();  // what it tells Pass::units about
// Units do not nest: the outermost declared unit wins. A beginUnit() inside an open unit is
// accepted (a composite does not know whether its container declared one around it) and its
// endUnit() returns nullopt: those entries belong to the outer unit. A declared unit that
// registered no parameters is not listed either (endUnit() returns nullopt: a ReLU's unit). Each run
// of entries registered outside any declared unit forms an implicit unit (declared == false), so
// units() always partitions the entries in forward order, and the units' slices
// [offset, offset + numel) tile the flat buffers [0, numel()) — what a shard map cuts and what
// ZeRO-3 gathers unit by unit. Buffers (addBuffer) belong to no unit.
//
// How a bf16 pass reads each parameter (Entry::readAsBf16): the layer that owns it declares, with
// declareReadAsBf16(), a parameter that every bf16 pass (Pass::precision kBF16) reads only rounded
// to bf16 (nn::Linear's weight and bias, read from the bf16 copy below); every other parameter is read
// exactly, in fp32 (LayerNorm's, an embedding table: a GPT's wte is read exactly by its lookup, so
// its head's rounded read does not make it bf16-read). A sharded job may then send the declared
// ones over the wire as bf16 (train/placement/gather_plan.h): declare only what holds for every
// module that reads the parameter.
//
// The bf16 copy (GPUs): one flat buffer of numel() bf16 elements in the value buffer's layout,
// element i = bf16(values[i]) rounded as runtime/cuda convertToBf16 rounds (the padding too), made
// on first use on the values' device and kept until relocate(). Every module that reads a parameter
// rounded to bf16 (nn::Linear's weight and bias, a GPT head's wte) reads halfValue(), a view into
// it, and keeps no bf16 copy of its own. The rule: the copy is never read stale.
//   trusted   trustHalfCopy(true) by an owner that controls every write of the values (the Trainer
//             over a placement whose values change only by its optimizer's step: one process, or
//             replicas on GPUs; train::Job::trustHalfCopy): it refreshes the copy then, and keeps it
//             current at each write (the optimizer's step kernel writes it, nn::Optimizer::
//             setHalfCopy; a checkpoint load refreshes it); halfValue() converts nothing. An owner
//             that writes the values another way refreshes it (refreshHalfCopy) before the next
//             pass, and says trustHalfCopy(false) when it stops (the Trainer at the end of run()).
//   untrusted (a loop of one's own, ZeRO, Hogwild, whose values others write; the default) a bf16
//             nn::Model::forward refreshes the copy once at its start (openHalfPass: one kernel over
//             the whole buffer) and its layers read it; Model::backward's layers (a recomputed
//             forward) read what that forward read. Outside a Model's pass, or where the whole value
//             buffer is not there to read (ZeRO-3), halfValue() first converts the entry's own value
//             (one kernel) into its slice of the copy, as each layer did before the copy existed.
// The copy is this process's (private device memory, also where the values are shared).
// Thread safety: none; binding happens once at start-up.
//
//   ParamBuffer params;
//   model.registerParams(params);      // Linear adds "fc0.weight", "fc0.bias", ...
//   params.allocate(cpuAllocator());
//   optimizer.step(params.values(), params.grads());
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "runtime/allocator.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"

namespace cohort::nn {

using runtime::Shape;
using runtime::Tensor;

class ParamBuffer {
 public:
  struct Entry {
    std::string name = {};
    Shape shape = {};
    size_t offset = 0;  // in elements from the start of the buffer
    size_t numel = 0;
    bool readAsBf16 = false;  // every bf16 pass reads it rounded to bf16 (above); false: exactly
  };
  // A unit (above): entries [firstEntry, endEntry) and their slice of the flat value and gradient
  // buffers, [offset, offset + numel): from the end of the previous unit's last entry (0 for the
  // first unit; the alignment padding before its first entry included) to the end of its own last
  // entry.
  struct Unit {
    std::string name = {};  // unique; declared: as given; implicit: the path its entries share ("fc0")
    size_t firstEntry = 0, endEntry = 0;
    size_t offset = 0, numel = 0;
    bool declared = false;
  };

  // Registers one parameter; returns its index. Throws if already bound or the name repeats.
  size_t add(const std::string& name, const Shape& shape, Tensor* value, Tensor* grad);
  // Declares that bf16 passes read parameter `entry` (add()'s index) only rounded to bf16 (above).
  // Throws InvalidArgument if already bound or for an index add() did not return.
  void declareReadAsBf16(size_t entry);
  // Registers one non-trainable state tensor, which binding fills with `initial` (on CPU); returns
  // its index among the buffers. Throws if already bound or the name repeats (among parameters too).
  size_t addBuffer(const std::string& name, const Shape& shape, Tensor* value, float initial = 0.0f);

  // Opens a unit named `name` (e.g. prefix + "h.3") for the entries added until the matching
  // endUnit(); inside an open unit it only counts the nesting (the outer unit wins). InvalidArgument
  // for an empty name, after binding, or for a name a listed unit has (listed names are unique).
  void beginUnit(const std::string& name);
  // Closes the unit the last beginUnit() opened. Returns it as listed by units() when it is an
  // outermost unit that registered parameters, otherwise nullopt. InvalidArgument without a unit
  // begun or after binding.
  std::optional<Unit> endUnit();

  // Allocates values, gradients and buffers from `allocator` (any device): values and gradients
  // zeroed, buffers set to their initial values. InvalidArgument while a unit is open (as attach).
  void allocate(runtime::Allocator& allocator);
  // Values live at `values` (numel() floats on `device`, owned by the caller); gradients and
  // buffers are allocated from `gradAllocator`.
  void attach(float* values, runtime::Device device, runtime::Allocator& gradAllocator);
  // allocate() without the gradients: as if dropWhole({.grads = true}) followed, without the whole
  // gradient ever being allocated (a sharded job's, train::Job::place).
  void allocateValues(runtime::Allocator& allocator);
  // Moves a bound buffer elsewhere: the values to `where.values` (external memory of numel() floats
  // on `where.device`, owned by the caller) or, when that is null, to fresh memory from
  // `where.allocator`; gradients and buffers always to fresh memory from `where.allocator`. The
  // current values (unless copyValues is false: the external memory already holds them), gradients
  // and buffers are copied over (blocking copies, any devices), and every registered Tensor is
  // pointed at the new place (gradients that dropWhole dropped stay dropped). Used to initialise a
  // model on the CPU and then place it on a GPU or
  // in memory the ranks of a job share (train::Job). The old memory is released (owned) or left to
  // its owner (attached).
  struct Placement {
    float* values = nullptr;
    runtime::Device device = {};
    runtime::Allocator* allocator = nullptr;
    bool copyValues = true;
  };
  void relocate(const Placement& where);
  // After binding on the CPU: the gradients move to external memory (numel() floats, zeroed here,
  // owned by the caller), e.g. a shared segment where the other workers read them (synchronous
  // sharded training); every registered gradient Tensor is pointed there.
  void placeGrads(float* grads);

  // Sharded training (ZeRO 2 and 3; train/placement/shard_sync.h) keeps no whole buffer: after binding
  // (on the CPU or a GPU), dropWhole releases the whole gradient buffer (and with `values` the value buffer),
  // leaving every registered Tensor of that kind undefined until placeUnit points a unit's at memory
  // of its own; grads()/values() are then undefined too. bytes() and the layout stay. A unit's
  // memory is `unit.numel` floats (the unit's slice, padding between entries included): each entry
  // at its offset within the unit, on the device the whole buffers were on. Null leaves that kind
  // as it is.
  struct WholeBuffers {
    bool values = false;
    bool grads = false;
  };
  void dropWhole(const WholeBuffers& which);
  void placeUnit(size_t unit, float* values, float* grads);
  // Leaves the unit's registered Tensors of the kinds `which` names undefined (its window is gone).
  void clearUnit(size_t unit, const WholeBuffers& which);
  bool bound() const { return bound_; }
  size_t numel() const { return numel_; }
  size_t bytes() const { return numel_ * sizeof(float); }
  const std::vector<Entry>& entries() const { return entries_; }
  // Every unit, declared and implicit, in forward order (above).
  const std::vector<Unit>& units() const { return units_; }
  const Unit* findUnit(const std::string& name) const;
  const Entry* find(const std::string& name) const;
  // The flat buffers, shape [numel()].
  const Tensor& values() const { return values_; }
  const Tensor& grads() const { return grads_; }
  // The view of one parameter (or its gradient) by entry index.
  Tensor value(size_t index) const;
  Tensor grad(size_t index) const;
  void zeroGrads() const;

  // Non-trainable state, laid out like the parameters in its own flat buffer.
  size_t bufferNumel() const { return bufferNumel_; }
  const std::vector<Entry>& bufferEntries() const { return bufferEntries_; }
  const Entry* findBuffer(const std::string& name) const;
  const Tensor& buffers() const { return buffers_; }  // shape [bufferNumel()]
  Tensor buffer(size_t index) const;

  // Whether some parameter is declared read as bf16 (declareReadAsBf16): a bf16 pass reads the copy.
  bool readsAnyAsBf16() const;
  // The bf16 copy (above; GPUs only: InvalidArgument for values on the CPU or a build without CUDA).
  // Its device address, numel() bf16 elements (what an optimizer kernel that writes it takes);
  // nullptr until made.
  void* halfCopy() const { return half_.defined() ? half_.raw() : nullptr; }
  // Makes the copy from `allocator` (the values' device) unless it exists.
  void makeHalfCopy(runtime::Allocator& allocator);
  // Rewrites the whole copy from the whole value buffer: one kernel on `stream`. InvalidArgument
  // without the copy or the whole values (ZeRO-3 dropped them).
  void refreshHalfCopy(const runtime::Stream& stream);
  // The owner's word (above). trusted: the copy is current now and stays so by its care.
  void trustHalfCopy(bool trusted);
  bool halfCopyTrusted() const { return halfTrusted_; }
  // nn::Model's bf16 passes on a GPU (above): a forward's makes the copy (from `allocator`) and,
  // untrusted and with the whole values, refreshes it; a backward's lets its layers read what the
  // last forward's refresh wrote. closeHalfPass() ends either.
  enum class HalfPass { kForward, kBackward };
  void openHalfPass(HalfPass kind, runtime::Allocator& allocator, const runtime::Stream& stream);
  void closeHalfPass() { halfCurrent_ = false; }
  // Parameter `index` rounded to bf16, a view into the copy (its shape, dtype bf16) for a layer of
  // a bf16 pass: converted first from the entry's value unless the copy is current (above).
  Tensor halfValue(size_t index, runtime::Allocator& allocator, const runtime::Stream& stream);
  // Conversion kernels the copy's refreshes and halfValue() have enqueued (tests count them; a CUDA
  // graph's replays run no host code and are not counted).
  uint64_t halfConversions() const { return halfConversions_; }

 private:
  void bind(runtime::Allocator& bufferAllocator);
  void allocateWhole(runtime::Allocator& allocator, bool withGrads);
  void requireNoOpenUnit() const;
  size_t unitsEnd() const { return units_.empty() ? 0 : units_.back().offset + units_.back().numel; }
  void addToImplicitUnit(size_t entry);

  std::vector<Entry> entries_;
  std::vector<Unit> units_;
  int openUnits_ = 0;     // the nesting depth of beginUnit() calls
  std::string openName_;  // the outermost open unit's name and first entry
  size_t openFirst_ = 0;
  std::vector<std::pair<Tensor*, Tensor*>> targets_;
  size_t numel_ = 0;
  Tensor values_;
  Tensor grads_;
  bool bound_ = false;  // binding happened (the whole buffers may have been dropped since)
  runtime::Device unitDevice_ = runtime::Device::cpu();  // where placeUnit's memory is (dropWhole)
  std::vector<Entry> bufferEntries_;
  std::vector<Tensor*> bufferTargets_;
  std::vector<float> bufferInitial_;
  size_t bufferNumel_ = 0;
  Tensor buffers_;
  Tensor half_;               // the bf16 copy (above)
  bool halfTrusted_ = false;  // trustHalfCopy
  bool halfCurrent_ = false;  // inside a Model pass that may read the copy as it is
  bool halfOfForward_ = false;  // the copy holds the last Model forward's refresh
  uint64_t halfConversions_ = 0;
};

}  // namespace cohort::nn
