// XLA FFI handlers for ksim's native engine (physics_impl='mujoco', ksim/physics/native.py): the host work of
// the Python callbacks (NativeEngine._host and NativeEngine._contacts_host) in C++, so that the programs hold
// no Python callback (they reach JAX's persistent compilation cache) and no control step crosses into Python.
//
// Each handler does what its Python callback does, in the same order and with the same conversions, so the two
// paths give the same bits: float32 state rows written into the float64 rows of a pooled mjBatch, the
// randomized model fields into its expanded fields, mjb_step / mjb_forward, the fields asked for read back and
// rounded to float32; the contacts from mj_forward of each env's state (mjb_apply on the same pooled batches).
// A model is registered once under a key of its contents (ksim_ffi_register_model); the programs name the key.

#include <mujoco/mjbatch.h>
#include <mujoco/mjxmacro.h>
#include <mujoco/mujoco.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

#ifndef KSIM_FFI_BUILD_INFO
#define KSIM_FFI_BUILD_INFO "unknown"
#endif

namespace {

// ----- model fields by name ----------------------------------------------------------------------------------

enum class Kind { kDouble, kFloat, kInt, kByte, kOther };

template <typename T>
constexpr Kind KindOf() {
  if constexpr (std::is_same_v<T, double>) return Kind::kDouble;
  if constexpr (std::is_same_v<T, float>) return Kind::kFloat;
  if constexpr (std::is_same_v<T, int>) return Kind::kInt;
  if constexpr (sizeof(T) == 1) return Kind::kByte;
  return Kind::kOther;
}

struct FieldRef {
  void* data = nullptr;
  Kind kind = Kind::kOther;
  int64_t count = 0;  // elements
};

// An mjModel array field by name (mjxmacro's table of mjModel's pointers).
bool ModelField(const mjModel* m, std::string_view name, FieldRef* out) {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-variable"
  MJMODEL_POINTERS_PREAMBLE(m)
#pragma GCC diagnostic pop
#define X(type, field, nr, nc)                                                                    \
  if (name == #field) {                                                                           \
    *out = {const_cast<void*>(static_cast<const void*>(m->field)), KindOf<type>(),                \
            static_cast<int64_t>(m->nr) * static_cast<int64_t>(nc)};                              \
    return true;                                                                                  \
  }
#define XNV X
  MJMODEL_POINTERS
#undef X
#undef XNV
  return false;
}

size_t KindSize(Kind kind) {
  switch (kind) {
    case Kind::kDouble: return 8;
    case Kind::kFloat: case Kind::kInt: return 4;
    case Kind::kByte: return 1;
    default: return 0;
  }
}

// Element i of dst (of kind) = value, converted as NumPy's assignment converts (a C cast).
template <typename V>
void Store(void* dst, Kind kind, int64_t i, V value) {
  switch (kind) {
    case Kind::kDouble: static_cast<double*>(dst)[i] = static_cast<double>(value); break;
    case Kind::kFloat: static_cast<float*>(dst)[i] = static_cast<float>(value); break;
    case Kind::kInt: static_cast<int*>(dst)[i] = static_cast<int>(value); break;
    case Kind::kByte: static_cast<unsigned char*>(dst)[i] = static_cast<unsigned char>(value); break;
    default: break;
  }
}

// ----- the state -----------------------------------------------------------------------------------------------

// The mjtState components a packed state row may hold, by ksim's names for them. Which of them a row holds, and in
// what order, comes with each call (its `state` attribute: native.STATE, the one definition of the row).
struct StateComponent {
  std::string_view name;
  int component;
};
constexpr StateComponent kComponents[] = {
    {"qpos", mjSTATE_QPOS}, {"qvel", mjSTATE_QVEL}, {"act", mjSTATE_ACT}, {"qacc_warmstart", mjSTATE_WARMSTART},
    {"time", mjSTATE_TIME}, {"ctrl", mjSTATE_CTRL}, {"xfrc_applied", mjSTATE_XFRC_APPLIED},
};

// The mjtState component ksim calls `name`; 0 for a name that is none.
int Component(std::string_view name) {
  for (const StateComponent& known : kComponents) {
    if (name == known.name) return known.component;
  }
  return 0;
}

std::vector<std::string_view> Split(std::string_view text) {
  std::vector<std::string_view> parts;
  while (!text.empty()) {
    size_t comma = text.find(',');
    parts.push_back(text.substr(0, comma));
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return parts;
}

// A call's packed state row: its fields' components in order, and its width in floats.
struct StateRow {
  std::vector<int> components;
  int64_t width = 0;

  ffi::Error Read(const mjModel* m, std::string_view attr) {
    for (std::string_view name : Split(attr)) {
      int component = Component(name);
      if (component == 0) return ffi::Error::InvalidArgument("ksim: no state component " + std::string(name));
      components.push_back(component);
      width += mj_stateSize(m, component);
    }
    if (width == 0) return ffi::Error::InvalidArgument("ksim: the state row holds nothing");
    return ffi::Error::Success();
  }
};

// ----- the randomized fields of one call -------------------------------------------------------------------------

// Each env's values of the fields a call randomizes (float32 from JAX), and body_subtreemass where body_mass is
// among them (native.with_subtree_mass: the masses summed up the tree in float64).
struct CallFields {
  std::vector<std::string> names;
  std::vector<const float*> values;  // n x count, or null for subtreemass
  std::vector<int64_t> counts;
  std::vector<double> subtreemass;  // n x nbody
  bool has_subtreemass = false;

  ffi::Error Read(const mjModel* m, std::string_view field_names, const ffi::RemainingArgs& args, int64_t n) {
    std::vector<std::string_view> listed = Split(field_names);
    if (listed.size() != args.size()) return ffi::Error::InvalidArgument("ksim: field names and arrays differ");
    const float* mass = nullptr;
    for (size_t i = 0; i < listed.size(); ++i) {
      auto buffer = args.get<ffi::Buffer<ffi::F32>>(i);
      if (!buffer.has_value()) return ffi::Error::InvalidArgument("ksim: a field is not a float32 array");
      FieldRef ref;
      if (!ModelField(m, listed[i], &ref) || ref.kind == Kind::kOther) {
        return ffi::Error::InvalidArgument("ksim: the FFI engine cannot randomize " + std::string(listed[i]));
      }
      if (static_cast<int64_t>(buffer->element_count()) != n * ref.count) {
        return ffi::Error::InvalidArgument("ksim: field " + std::string(listed[i]) + " has the wrong size");
      }
      if (listed[i] == "body_subtreemass") continue;  // computed from body_mass, as the callback does
      names.emplace_back(listed[i]);
      values.push_back(buffer->typed_data());
      counts.push_back(ref.count);
      if (listed[i] == "body_mass") mass = buffer->typed_data();
    }
    if (mass != nullptr) {
      int nbody = m->nbody;
      subtreemass.resize(n * nbody);
      for (int64_t env = 0; env < n; ++env) {
        double* row = subtreemass.data() + env * nbody;
        for (int b = 0; b < nbody; ++b) row[b] = static_cast<double>(mass[env * nbody + b]);
        for (int b = nbody - 1; b > 0; --b) row[m->body_parentid[b]] += row[b];  // every body after its parent
      }
      names.emplace_back("body_subtreemass");
      values.push_back(nullptr);
      counts.push_back(nbody);
      has_subtreemass = true;
    }
    return ffi::Error::Success();
  }

  // Field i's values for env into dst (of kind), converted as NumPy's assignment converts them.
  void Write(size_t i, int64_t env, void* dst, Kind kind) const {
    int64_t count = counts[i];
    if (values[i] == nullptr) {
      const double* src = subtreemass.data() + env * count;
      for (int64_t k = 0; k < count; ++k) Store(dst, kind, k, src[k]);
    } else {
      const float* src = values[i] + env * count;
      for (int64_t k = 0; k < count; ++k) Store(dst, kind, k, src[k]);
    }
  }
};

// ----- the registry: models, pooled batches and scratch data -----------------------------------------------------

struct Expanded {
  char* data;
  Kind kind;
  int64_t count;
};

// One mjBatch and the fields it expanded (native._Sims).
struct Sims {
  mjBatch* batch = nullptr;
  int nsim = 0;
  std::map<std::string, Expanded, std::less<>> expanded;
  std::map<std::string, std::pair<const double*, int>, std::less<>> outputs;

  ~Sims() {
    if (batch != nullptr) mjb_deleteBatch(batch);
  }
};

struct Entry {
  mjModel* model = nullptr;  // the registry's own copy
  std::mutex lock;           // guards the free lists
  std::vector<std::unique_ptr<Sims>> free_sims;
  std::atomic<int64_t> nanos{0};
  std::atomic<int64_t> calls[3] = {0, 0, 0};  // forward, step, contacts

  ~Entry() {
    free_sims.clear();
    if (model != nullptr) mj_deleteModel(model);
  }
};

std::mutex registry_lock;
std::map<std::string, std::unique_ptr<Entry>, std::less<>>& Registry() {
  static auto* registry = new std::map<std::string, std::unique_ptr<Entry>, std::less<>>();  // never destroyed
  return *registry;
}

Entry* Find(std::string_view key) {
  std::lock_guard<std::mutex> guard(registry_lock);
  auto it = Registry().find(key);
  return it == Registry().end() ? nullptr : it->second.get();
}

// Adds seconds since `start` to the entry's clock when it goes out of scope.
struct Timed {
  Entry* entry;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  ~Timed() {
    auto spent = std::chrono::steady_clock::now() - start;
    entry->nanos += std::chrono::duration_cast<std::chrono::nanoseconds>(spent).count();
  }
};

// The cheapest free batch with at least n simulations, or a new one of n (native._Pool.take).
std::unique_ptr<Sims> TakeSims(Entry* entry, int n, int nthread, std::string* error) {
  {
    std::lock_guard<std::mutex> guard(entry->lock);
    auto& free = entry->free_sims;
    auto best = free.end();
    for (auto it = free.begin(); it != free.end(); ++it) {
      if ((*it)->nsim >= n && (best == free.end() || (*it)->nsim < (*best)->nsim)) best = it;
    }
    if (best != free.end()) {
      std::unique_ptr<Sims> sims = std::move(*best);
      free.erase(best);
      return sims;
    }
  }
  mjBatchConfig config;
  mjb_defaultConfig(&config);
  config.nthread = nthread;
  config.persistent = 0;
  char message[512] = "";
  auto sims = std::make_unique<Sims>();
  sims->batch = mjb_makeBatch(entry->model, n, &config, message, sizeof(message));
  if (sims->batch == nullptr) {
    *error = message;
    return nullptr;
  }
  sims->nsim = n;
  return sims;
}

void GiveSims(Entry* entry, std::unique_ptr<Sims> sims) {
  std::lock_guard<std::mutex> guard(entry->lock);
  entry->free_sims.push_back(std::move(sims));
}

// ----- the step handler ------------------------------------------------------------------------------------------

// Writes each env's randomized fields into the batch, and the model's own values where a field that an earlier
// call expanded is not randomized in this one (native._Sims.write_fields).
ffi::Error WriteFields(const mjModel* m, Sims* sims, const CallFields& fields, int64_t n) {
  for (size_t i = 0; i < fields.names.size(); ++i) {
    const std::string& name = fields.names[i];
    auto it = sims->expanded.find(name);
    if (it == sims->expanded.end()) {
      int size = 0, elemsize = 0;
      void* data = mjb_expand(sims->batch, name.c_str(), &size, &elemsize);
      FieldRef ref;
      ModelField(m, name, &ref);
      if (data == nullptr || size != ref.count || static_cast<size_t>(elemsize) != KindSize(ref.kind)) {
        return ffi::Error::InvalidArgument("ksim: mjb_expand refuses " + name);
      }
      it = sims->expanded.emplace(name, Expanded{static_cast<char*>(data), ref.kind, ref.count}).first;
    }
    const Expanded& live = it->second;
    size_t row = live.count * KindSize(live.kind);
    for (int64_t env = 0; env < n; ++env) fields.Write(i, env, live.data + env * row, live.kind);
  }
  for (const auto& [name, live] : sims->expanded) {
    if (std::find(fields.names.begin(), fields.names.end(), name) != fields.names.end()) continue;
    FieldRef ref;
    ModelField(m, name, &ref);
    size_t row = live.count * KindSize(live.kind);
    for (int64_t env = 0; env < n; ++env) std::memcpy(live.data + env * row, ref.data, row);
  }
  return ffi::Error::Success();
}

// Where output `name` is read from: a state field's offset in the rows, or a derived field's output storage.
struct Source {
  const double* data;
  int64_t stride;  // between simulations
  int64_t size;
};

ffi::Error OutputSource(const mjModel* m, Sims* sims, std::string_view name, Source* source) {
  if (int component = Component(name); component != 0) {
    int size = 0;
    const double* first = mjb_stateComponent(sims->batch, component, &size);
    *source = {first, mjb_nstate(sims->batch), mj_stateSize(m, component)};
    return ffi::Error::Success();
  }
  auto it = sims->outputs.find(name);
  if (it == sims->outputs.end()) {
    int size = 0, elemsize = 0;
    std::string key(name);
    void* data = mjb_output(sims->batch, key.c_str(), &size, &elemsize);
    if (data == nullptr || elemsize != sizeof(double)) {
      return ffi::Error::InvalidArgument("ksim: mjb_output refuses " + key);
    }
    it = sims->outputs.emplace(key, std::make_pair(static_cast<const double*>(data), size)).first;
  }
  *source = {it->second.first, it->second.second, it->second.second};
  return ffi::Error::Success();
}

// A call's batch, taken from the pool for the call's envs and given back when the call ends.
struct Call {
  Entry* entry;
  std::unique_ptr<Sims> sims;
  ~Call() {
    if (sims != nullptr) GiveSims(entry, std::move(sims));
  }
};

// Takes a batch for the n envs and writes their packed float32 state rows into its float64 rows and their
// fields into its expanded fields (the first half of NativeEngine._host).
ffi::Error Load(Call* call, const StateRow& row, const float* in, int64_t n, int64_t nthread,
                const CallFields& fields) {
  const mjModel* m = call->entry->model;
  std::string message;
  call->sims = TakeSims(call->entry, static_cast<int>(n), static_cast<int>(nthread), &message);
  if (call->sims == nullptr) return ffi::Error::Internal("ksim: mjb_makeBatch: " + message);
  mjBatch* b = call->sims->batch;
  double* rows = mjb_state(b);
  int64_t nstate = mjb_nstate(b), packed = 0;
  for (int component : row.components) {
    int64_t offset = mjb_stateComponent(b, component, nullptr) - rows, size = mj_stateSize(m, component);
    for (int64_t env = 0; env < n; ++env) {
      double* dst = rows + env * nstate + offset;
      const float* src = in + env * row.width + packed;
      for (int64_t k = 0; k < size; ++k) dst[k] = static_cast<double>(src[k]);
    }
    packed += size;
  }
  return WriteFields(m, call->sims.get(), fields, n);
}

// The simulations 0..n-1 for mjb calls: null where they are all of the batch's.
std::vector<int> Ids(const Sims& sims, int64_t n) {
  std::vector<int> ids;
  if (n != sims.nsim) {
    ids.resize(n);
    std::iota(ids.begin(), ids.end(), 0);
  }
  return ids;
}

// Writes the envs' packed state and their fields into a batch, runs `nstep` substeps (0: the forward stages only)
// and then the stages up to `stage`, and reads the `outputs` fields back into one float32 row per env
// (NativeEngine._host). A simulation MuJoCo refuses to run comes back as a row of NaN.
ffi::Error StepImpl(ffi::Buffer<ffi::F32> state, ffi::RemainingArgs field_args, ffi::ResultBuffer<ffi::F32> out,
                    std::string_view model, std::string_view state_attr, std::string_view fields_attr,
                    std::string_view outputs_attr, int64_t nstep, int64_t stage, int64_t nthread) {
  Entry* entry = Find(model);
  if (entry == nullptr) return ffi::Error::InvalidArgument("ksim: model not registered");
  Timed timed{entry};
  entry->calls[nstep == 0 ? 0 : 1]++;
  const mjModel* m = entry->model;
  StateRow row;
  if (ffi::Error error = row.Read(m, state_attr); error.failure()) return error;
  int64_t width = row.width;
  int64_t n = state.element_count() / width;
  if (n * width != static_cast<int64_t>(state.element_count())) {
    return ffi::Error::InvalidArgument("ksim: the state rows have the wrong width");
  }
  if (n == 0) return ffi::Error::Success();
  int64_t out_width = static_cast<int64_t>(out->element_count()) / n;
  CallFields fields;
  if (ffi::Error error = fields.Read(m, fields_attr, field_args, n); error.failure()) return error;
  Call call{entry, nullptr};
  if (ffi::Error error = Load(&call, row, state.typed_data(), n, nthread, fields); error.failure()) return error;
  std::vector<std::string_view> outputs = Split(outputs_attr);
  std::vector<Source> sources(outputs.size());
  int64_t total = 0;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (ffi::Error error = OutputSource(m, call.sims.get(), outputs[i], &sources[i]); error.failure()) return error;
    total += sources[i].size;
  }
  if (total != out_width) return ffi::Error::InvalidArgument("ksim: the output rows have the wrong width");

  mjBatch* b = call.sims->batch;
  std::vector<int> ids = Ids(*call.sims, n);
  const int* id_ptr = ids.empty() ? nullptr : ids.data();
  int failed = nstep == 0 ? mjb_forward(b, id_ptr, static_cast<int>(n), static_cast<int>(stage))
                          : mjb_step(b, id_ptr, static_cast<int>(n), static_cast<int>(nstep), static_cast<int>(stage));

  float* dst = out->typed_data();
  int64_t offset = 0;
  for (const Source& source : sources) {
    for (int64_t env = 0; env < n; ++env) {
      const double* src = source.data + env * source.stride;
      float* row = dst + env * out_width + offset;
      for (int64_t k = 0; k < source.size; ++k) row[k] = static_cast<float>(src[k]);
    }
    offset += source.size;
  }
  if (failed > 0) {  // MuJoCo refused to run them: a NaN state ends their episodes (`physics_diverged`)
    const int* status = mjb_status(b);
    for (int64_t env = 0; env < n; ++env) {
      if (status[env] != 0) std::fill_n(dst + env * out_width, out_width, std::numeric_limits<float>::quiet_NaN());
    }
  }
  return ffi::Error::Success();
}

// ----- the contacts handler --------------------------------------------------------------------------------------

struct Kept {  // one contact of the table
  int64_t env, rank;
  int geom1, geom2;
  double dist, pos[3];
  int facets;
  double efc[10];  // the constraint forces of its facets (0 where it has no constraint rows)
};

// NumPy's sum of one row of `width` float64 values (pairwise, eight accumulators from eight values on), so the
// normal forces are the bits the callback's `.sum(axis=1)` gives.
double NumpyRowSum(const double* a, int n) {
  double res;
  if (n < 8) {
    res = -0.0;
    for (int i = 0; i < n; ++i) res += a[i];
  } else {
    double r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    int i = 8;
    for (; i < n - (n % 8); i += 8) {
      for (int j = 0; j < 8; ++j) r[j] += a[i + j];
    }
    res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
  }
  return 0.0 + res;  // the reduction's identity, which the result is added to
}

// What mjb_apply hands each simulation of a contacts call, and where it leaves the kept contacts of each env.
struct ContactsArg {
  int64_t rows;
  bool pyramidal;
  std::vector<std::vector<Kept>>* kept;  // per env
};

// One simulation's contacts: mj_forward of its state (loaded by mjb_apply from its row, in its model with its
// expanded fields), then its deepest `rows` contacts, ties in the list's order.
void CollectContacts(const mjModel* m, mjData* d, int sim, void* raw) {
  const auto* arg = static_cast<const ContactsArg*>(raw);
  mj_forward(m, d);
  int ncon = d->ncon;
  std::vector<int> order(ncon);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [d](int a, int b) {
    double x = d->contact[a].dist, y = d->contact[b].dist;
    return x < y || (!std::isnan(x) && std::isnan(y));  // NumPy sorts NaN last
  });
  std::vector<Kept>& kept = (*arg->kept)[sim];
  kept.clear();
  for (int64_t rank = 0; rank < std::min<int64_t>(arg->rows, ncon); ++rank) {
    const mjContact& contact = d->contact[order[rank]];
    Kept k{sim, rank, contact.geom[0], contact.geom[1], contact.dist, {}, 1, {}};
    std::copy_n(contact.pos, 3, k.pos);
    if (arg->pyramidal) k.facets = contact.dim == 1 ? 1 : 2 * (contact.dim - 1);
    for (int f = 0; f < k.facets && f < 10; ++f) {
      k.efc[f] = contact.efc_address >= 0 ? d->efc_force[contact.efc_address + f] : 0.0;
    }
    kept.push_back(k);
  }
}

// Each env's contacts: its state and fields written into a pooled batch as for a step, mj_forward of each
// simulation on the batch's threads, the deepest `rows` contacts of each and their normal forces as
// mj_contactForce gives them (NativeEngine._contacts_host, which runs the same mj_forward env by env in a model
// and data of its own). A simulation MuJoCo refuses to run fails the call, as the callback raises.
ffi::Error ContactsImpl(ffi::Buffer<ffi::F32> state, ffi::RemainingArgs field_args,
                        ffi::ResultBuffer<ffi::S32> geom1, ffi::ResultBuffer<ffi::S32> geom2,
                        ffi::ResultBuffer<ffi::F32> dist, ffi::ResultBuffer<ffi::F32> pos,
                        ffi::ResultBuffer<ffi::F32> normal_force, std::string_view model,
                        std::string_view state_attr, std::string_view fields_attr, int64_t nthread) {
  Entry* entry = Find(model);
  if (entry == nullptr) return ffi::Error::InvalidArgument("ksim: model not registered");
  Timed timed{entry};
  entry->calls[2]++;
  const mjModel* m = entry->model;
  StateRow row;
  if (ffi::Error error = row.Read(m, state_attr); error.failure()) return error;
  int64_t width = row.width;
  int64_t n = state.element_count() / width;
  if (n * width != static_cast<int64_t>(state.element_count())) {
    return ffi::Error::InvalidArgument("ksim: the state rows have the wrong width");
  }
  if (n == 0) return ffi::Error::Success();
  int64_t rows = static_cast<int64_t>(dist->element_count()) / n;
  CallFields fields;
  if (ffi::Error error = fields.Read(m, fields_attr, field_args, n); error.failure()) return error;
  Call call{entry, nullptr};
  if (ffi::Error error = Load(&call, row, state.typed_data(), n, nthread, fields); error.failure()) return error;
  std::vector<std::vector<Kept>> kept(call.sims->nsim);
  ContactsArg arg{rows, m->opt.cone == mjCONE_PYRAMIDAL, &kept};
  std::vector<int> ids = Ids(*call.sims, n);
  int failed = mjb_apply(call.sims->batch, ids.empty() ? nullptr : ids.data(), static_cast<int>(n), CollectContacts,
                         &arg, /*save=*/0);
  if (failed > 0) {
    const int* status = mjb_status(call.sims->batch);
    int64_t env = std::find_if(status, status + n, [](int s) { return s != 0; }) - status;
    return ffi::Error::Internal("ksim: MuJoCo raised in the contacts of env " + std::to_string(env) + ": " +
                                mjb_error(call.sims->batch, static_cast<int>(env)));
  }

  int32_t* g1 = geom1->typed_data();
  int32_t* g2 = geom2->typed_data();
  float* dd = dist->typed_data();
  float* pp = pos->typed_data();
  float* ff = normal_force->typed_data();
  std::fill_n(g1, n * rows, -1);
  std::fill_n(g2, n * rows, -1);
  std::fill_n(dd, n * rows, 1.0f);
  std::fill_n(pp, n * rows * 3, 0.0f);
  std::fill_n(ff, n * rows, 0.0f);
  int facets = 1;  // the callback sums as many columns as the most facets of any contact kept
  for (int64_t env = 0; env < n; ++env) {
    for (const Kept& k : kept[env]) facets = std::max(facets, k.facets);
  }
  for (int64_t env = 0; env < n; ++env) {
    for (const Kept& k : kept[env]) {
      int64_t at = k.env * rows + k.rank;
      g1[at] = k.geom1;
      g2[at] = k.geom2;
      dd[at] = static_cast<float>(k.dist);
      for (int c = 0; c < 3; ++c) pp[3 * at + c] = static_cast<float>(k.pos[c]);
      ff[at] = static_cast<float>(NumpyRowSum(k.efc, facets));
    }
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(KsimNativeStep, StepImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .RemainingArgs()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<std::string_view>("model")
                                  .Attr<std::string_view>("state")
                                  .Attr<std::string_view>("fields")
                                  .Attr<std::string_view>("outputs")
                                  .Attr<int64_t>("nstep")
                                  .Attr<int64_t>("stage")
                                  .Attr<int64_t>("nthread"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(KsimNativeContacts, ContactsImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .RemainingArgs()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<std::string_view>("model")
                                  .Attr<std::string_view>("state")
                                  .Attr<std::string_view>("fields")
                                  .Attr<int64_t>("nthread"));

// ----- plain C functions for the loader (ctypes) -----------------------------------------------------------------

extern "C" {

// The MuJoCo version of the headers this library was built against (mjVERSION_HEADER).
int ksim_ffi_mujoco_header_version() { return mjVERSION_HEADER; }

// What the build recorded: the source's hash and the jaxlib it was built against.
const char* ksim_ffi_build_info() { return KSIM_FFI_BUILD_INFO; }

// Registers a copy of the model at `address` (an mjModel*) under `key`; a key registered before keeps its model.
// Returns 0, or -1 where MuJoCo could not copy the model.
int ksim_ffi_register_model(const char* key, const void* address) {
  std::lock_guard<std::mutex> guard(registry_lock);
  auto& registry = Registry();
  if (registry.count(key) != 0) return 0;
  auto entry = std::make_unique<Entry>();
  entry->model = mj_copyModel(nullptr, static_cast<const mjModel*>(address));
  if (entry->model == nullptr) return -1;
  registry.emplace(key, std::move(entry));
  return 0;
}

// Seconds spent in the handlers of the model `key` (summed over concurrent callers); -1 if it is not registered.
double ksim_ffi_host_seconds(const char* key) {
  Entry* entry = Find(key);
  return entry == nullptr ? -1.0 : static_cast<double>(entry->nanos.load()) * 1e-9;
}

// Handler calls of the model `key` so far: kind 0 forward, 1 step, 2 contacts; -1 if it is not registered.
int64_t ksim_ffi_calls(const char* key, int kind) {
  Entry* entry = Find(key);
  return entry == nullptr || kind < 0 || kind > 2 ? -1 : entry->calls[kind].load();
}

}  // extern "C"
