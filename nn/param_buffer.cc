#include "nn/param_buffer.h"

#include <algorithm>

#include "runtime/error.h"

namespace cohort::nn {

// Each parameter starts at a multiple of 16 floats (64 bytes) so vector loads of any parameter are
// aligned; the padding is zero and costs under 64 bytes per parameter. Buffers are laid out alike.
static constexpr size_t kAlignElems = 16;

static ParamBuffer::Entry appendEntry(const std::string& name, const Shape& shape, size_t& numel) {
  ParamBuffer::Entry e;
  e.name = name;
  e.shape = shape;
  e.offset = (numel + kAlignElems - 1) / kAlignElems * kAlignElems;
  e.numel = static_cast<size_t>(shape.numel());
  numel = e.offset + e.numel;
  return e;
}

// The module part of an entry name: up to its last '.' ("h.0.attn.c_attn.weight" -> "h.0.attn.c_attn").
static std::string moduleOf(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(0, dot);
}

// The longest part of `a` that `b` shares, ending at a '.' of both or at the end of `a`
// ("h.0.ln_1", "h.0.attn" -> "h.0"); empty when they share no such part.
static std::string sharedPath(const std::string& a, const std::string& b) {
  const bool whole = b.compare(0, a.size(), a) == 0 && (b.size() == a.size() || b[a.size()] == '.');
  if (whole) return a;
  size_t end = 0;
  for (size_t i = 0; i < a.size() && i < b.size() && a[i] == b[i]; ++i) {
    if (a[i] == '.') end = i;
  }
  return a.substr(0, end);
}

size_t ParamBuffer::add(const std::string& name, const Shape& shape, Tensor* value, Tensor* grad) {
  if (bound()) COHORT_THROW(InvalidArgument) << "parameter '" << name << "' added after binding";
  if (find(name) || findBuffer(name)) COHORT_THROW(InvalidArgument) << "duplicate parameter name '" << name << "'";
  COHORT_CHECK(value && grad);
  entries_.push_back(appendEntry(name, shape, numel_));
  targets_.emplace_back(value, grad);
  if (openUnits_ == 0) addToImplicitUnit(entries_.size() - 1);
  return entries_.size() - 1;
}

void ParamBuffer::declareReadAsBf16(size_t entry) {
  if (bound()) COHORT_THROW(InvalidArgument) << "declareReadAsBf16 after binding";
  if (entry >= entries_.size()) {
    COHORT_THROW(InvalidArgument) << "declareReadAsBf16 of parameter " << entry << ", but " << entries_.size()
                                  << " are registered";
  }
  entries_[entry].readAsBf16 = true;
}

// Entries outside any declared unit: the entry extends the implicit unit just before it, or starts
// one. An implicit unit is named by the path its entries' modules share, or by its first entry's
// name when they share none, made unique with "@<first entry>" in the rare case another unit has it.
void ParamBuffer::addToImplicitUnit(size_t entry) {
  const Entry& e = entries_[entry];
  if (units_.empty() || units_.back().declared || units_.back().endEntry != entry) {
    units_.push_back({.name = "", .firstEntry = entry, .endEntry = entry, .offset = unitsEnd(), .declared = false});
  }
  Unit& u = units_.back();
  std::string name = moduleOf(entries_[u.firstEntry].name);
  for (size_t i = u.firstEntry + 1; i <= entry; ++i) name = sharedPath(name, moduleOf(entries_[i].name));
  if (name.empty()) name = entries_[u.firstEntry].name;
  if (findUnit(name) && findUnit(name) != &u) name += "@" + std::to_string(u.firstEntry);
  u.name = name;
  u.endEntry = entry + 1;
  u.numel = e.offset + e.numel - u.offset;
}

const ParamBuffer::Unit* ParamBuffer::findUnit(const std::string& name) const {
  for (const Unit& u : units_) {
    if (u.name == name) return &u;
  }
  return nullptr;
}

void ParamBuffer::beginUnit(const std::string& name) {
  if (bound()) COHORT_THROW(InvalidArgument) << "unit '" << name << "' begun after binding";
  if (name.empty()) COHORT_THROW(InvalidArgument) << "a parameter unit needs a name, got an empty one";
  if (openUnits_ > 0) {  // inside another unit, which its entries join
    ++openUnits_;
    return;
  }
  if (const Unit* other = findUnit(name)) {
    COHORT_THROW(InvalidArgument) << "parameter unit '" << name << "' declared twice"
                                  << (other->declared ? ""
                                                      : " (entries outside any unit already form one of that name)");
  }
  openUnits_ = 1;
  openName_ = name;
  openFirst_ = entries_.size();
}

std::optional<ParamBuffer::Unit> ParamBuffer::endUnit() {
  if (bound()) COHORT_THROW(InvalidArgument) << "endUnit() after binding";
  if (openUnits_ == 0) COHORT_THROW(InvalidArgument) << "endUnit() without a unit begun (beginUnit)";
  if (--openUnits_ > 0 || openFirst_ == entries_.size()) return std::nullopt;  // nested, or no parameters
  const size_t start = unitsEnd();
  const Entry& last = entries_.back();
  units_.push_back({.name = openName_,
                    .firstEntry = openFirst_,
                    .endEntry = entries_.size(),
                    .offset = start,
                    .numel = last.offset + last.numel - start,
                    .declared = true});
  return units_.back();
}

void ParamBuffer::requireNoOpenUnit() const {
  if (openUnits_ > 0) {
    COHORT_THROW(InvalidArgument) << "parameter unit '" << openName_ << "' still open at binding: endUnit() missing";
  }
}

size_t ParamBuffer::addBuffer(const std::string& name, const Shape& shape, Tensor* value, float initial) {
  if (bound()) COHORT_THROW(InvalidArgument) << "buffer '" << name << "' added after binding";
  if (find(name) || findBuffer(name)) COHORT_THROW(InvalidArgument) << "duplicate buffer name '" << name << "'";
  COHORT_CHECK(value);
  bufferEntries_.push_back(appendEntry(name, shape, bufferNumel_));
  bufferTargets_.push_back(value);
  bufferInitial_.push_back(initial);
  return bufferEntries_.size() - 1;
}

const ParamBuffer::Entry* ParamBuffer::find(const std::string& name) const {
  for (const Entry& e : entries_) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

const ParamBuffer::Entry* ParamBuffer::findBuffer(const std::string& name) const {
  for (const Entry& e : bufferEntries_) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

void ParamBuffer::allocate(runtime::Allocator& allocator) { allocateWhole(allocator, true); }

void ParamBuffer::allocateValues(runtime::Allocator& allocator) { allocateWhole(allocator, false); }

void ParamBuffer::allocateWhole(runtime::Allocator& allocator, bool withGrads) {
  COHORT_CHECK(!bound()) << "ParamBuffer bound twice";
  requireNoOpenUnit();
  const Shape shape{static_cast<int64_t>(numel_)};
  values_ = Tensor::empty(shape, allocator);
  if (withGrads) grads_ = Tensor::empty(shape, allocator);
  if (allocator.device().isCpu()) {
    values_.fill(0.0f);
    if (withGrads) grads_.fill(0.0f);
  } else if (numel_ > 0) {
    const Tensor zeros = Tensor::zeros(shape);  // a device's fresh memory holds anything
    values_.copyFrom(zeros);
    if (withGrads) grads_.copyFrom(zeros);
  }
  bind(allocator);
}

void ParamBuffer::attach(float* values, runtime::Device device, runtime::Allocator& gradAllocator) {
  COHORT_CHECK(!bound()) << "ParamBuffer bound twice";
  requireNoOpenUnit();
  values_ = Tensor::view(values, Shape{static_cast<int64_t>(numel_)}, device);
  grads_ = Tensor::empty(Shape{static_cast<int64_t>(numel_)}, gradAllocator);
  if (gradAllocator.device().isCpu()) grads_.fill(0.0f);
  bind(gradAllocator);
}

void ParamBuffer::relocate(const Placement& where) {
  COHORT_CHECK(bound() && where.allocator) << "relocate needs a bound ParamBuffer and an allocator";
  const Tensor oldValues = values_, oldGrads = grads_, oldBuffers = buffers_;
  const Shape shape{static_cast<int64_t>(numel_)};
  values_ = where.values ? Tensor::view(where.values, shape, where.device) : Tensor::empty(shape, *where.allocator);
  if (where.copyValues || !where.values) values_.copyFrom(oldValues);
  if (oldGrads.defined()) {  // dropped (dropWhole): they stay so
    grads_ = Tensor::empty(shape, *where.allocator);
    grads_.copyFrom(oldGrads);
  }
  bind(*where.allocator);  // fresh buffers; then the current values go over the initial ones
  buffers_.copyFrom(oldBuffers);
  half_ = Tensor();  // made again where the values now are, at its next use
  halfTrusted_ = halfCurrent_ = halfOfForward_ = false;
}

void ParamBuffer::placeGrads(float* grads) {
  COHORT_CHECK(bound() && values_.device().isCpu()) << "placeGrads needs a ParamBuffer bound on the CPU";
  grads_ = Tensor::view(grads, Shape{static_cast<int64_t>(numel_)});
  grads_.fill(0.0f);
  for (size_t i = 0; i < entries_.size(); ++i) *targets_[i].second = grad(i);
}

void ParamBuffer::bind(runtime::Allocator& bufferAllocator) {
  bound_ = true;
  // The buffers' initial values (BatchNorm's running variance starts at 1), written on the CPU and
  // copied to a device: a device's fresh memory holds anything.
  const Shape shape{static_cast<int64_t>(bufferNumel_)};
  Tensor initial = Tensor::zeros(shape);
  for (size_t i = 0; i < bufferEntries_.size(); ++i) {
    const Entry& e = bufferEntries_[i];
    std::fill_n(initial.data() + e.offset, e.numel, bufferInitial_[i]);
  }
  if (bufferAllocator.device().isCpu()) {
    buffers_ = std::move(initial);
  } else {
    buffers_ = Tensor::empty(shape, bufferAllocator);
    if (bufferNumel_ > 0) buffers_.copyFrom(initial);
  }
  for (size_t i = 0; i < entries_.size(); ++i) {
    *targets_[i].first = value(i);
    if (grads_.defined()) *targets_[i].second = grad(i);
  }
  for (size_t i = 0; i < bufferEntries_.size(); ++i) *bufferTargets_[i] = buffer(i);
}

Tensor ParamBuffer::value(size_t index) const {
  const Entry& e = entries_.at(index);
  return values_.narrowRows(static_cast<int64_t>(e.offset), static_cast<int64_t>(e.numel)).reshape(e.shape);
}

Tensor ParamBuffer::grad(size_t index) const {
  const Entry& e = entries_.at(index);
  return grads_.narrowRows(static_cast<int64_t>(e.offset), static_cast<int64_t>(e.numel)).reshape(e.shape);
}

Tensor ParamBuffer::buffer(size_t index) const {
  const Entry& e = bufferEntries_.at(index);
  return buffers_.narrowRows(static_cast<int64_t>(e.offset), static_cast<int64_t>(e.numel)).reshape(e.shape);
}

void ParamBuffer::zeroGrads() const { grads_.fill(0.0f); }

void ParamBuffer::dropWhole(const WholeBuffers& which) {
  COHORT_CHECK(bound()) << "dropWhole before binding";
  if (values_.defined()) unitDevice_ = values_.device();
  if (which.values) values_ = Tensor();
  if (which.grads) grads_ = Tensor();
  for (auto& [value, grad] : targets_) {
    if (which.values) *value = Tensor();
    if (which.grads) *grad = Tensor();
  }
}

void ParamBuffer::clearUnit(size_t unit, const WholeBuffers& which) {
  const Unit& u = units_.at(unit);
  for (size_t i = u.firstEntry; i < u.endEntry; ++i) {
    if (which.values) *targets_[i].first = Tensor();
    if (which.grads) *targets_[i].second = Tensor();
  }
}

void ParamBuffer::placeUnit(size_t unit, float* values, float* grads) {
  const Unit& u = units_.at(unit);
  for (size_t i = u.firstEntry; i < u.endEntry; ++i) {
    const Entry& e = entries_[i];
    const size_t at = e.offset - u.offset;
    if (values) *targets_[i].first = Tensor::view(values + at, e.shape, unitDevice_);
    if (grads) *targets_[i].second = Tensor::view(grads + at, e.shape, unitDevice_);
  }
}

}  // namespace cohort::nn
