package zero

import "libzero/internal/capi"

// EngineInfo is the engine's shape.
type EngineInfo struct {
	Rank, WorldSize, Stage, GradientAccumulationSteps int
	ParamDType, GradDType, CommDType                  DType
	NumParams, NumUnits, OptimizerThreads             int
	Deterministic                                     bool
	TimeoutSeconds                                    float64
}

func (e *Engine) info(h uintptr) (EngineInfo, error) {
	out := capi.NewZero_engine_info_t()
	defer capi.DeleteZero_engine_info_t(out)
	if err := call(func() error { return capi.Zero_engine_info(out, h) }); err != nil {
		return EngineInfo{}, err
	}
	return EngineInfo{Rank: out.GetRank(), WorldSize: out.GetWorld_size(), Stage: out.GetStage(),
		GradientAccumulationSteps: out.GetGradient_accumulation_steps(), ParamDType: DType(out.GetParam_dtype()),
		GradDType: DType(out.GetGrad_dtype()), CommDType: DType(out.GetComm_dtype()), NumParams: out.GetNum_params(),
		NumUnits: out.GetNum_units(), OptimizerThreads: out.GetOptimizer_threads(),
		Deterministic: out.GetDeterministic() != 0, TimeoutSeconds: out.GetTimeout_s()}, nil
}

// Info describes the engine.
func (e *Engine) Info() (EngineInfo, error) {
	h, err := e.lock()
	if err != nil {
		return EngineInfo{}, err
	}
	defer e.mu.Unlock()
	return e.info(h)
}

// MemoryStats is the bytes this rank allocated per category, padding included.
type MemoryStats struct {
	ParamBytes, GradBytes, MasterParamBytes, OptimizerStateBytes, BucketBytes, GatheredBytes, TotalBytes uint64
}

// MemoryStats reports this rank's allocations (after Finalize).
func (e *Engine) MemoryStats() (MemoryStats, error) {
	h, err := e.lock()
	if err != nil {
		return MemoryStats{}, err
	}
	defer e.mu.Unlock()
	out := capi.NewZero_memory_stats_t()
	defer capi.DeleteZero_memory_stats_t(out)
	if err := call(func() error { return capi.Zero_memory_stats(out, h) }); err != nil {
		return MemoryStats{}, err
	}
	return MemoryStats{ParamBytes: out.GetParam_bytes(), GradBytes: out.GetGrad_bytes(),
		MasterParamBytes: out.GetMaster_param_bytes(), OptimizerStateBytes: out.GetOptimizer_state_bytes(),
		BucketBytes: out.GetBucket_bytes(), GatheredBytes: out.GetGathered_bytes(), TotalBytes: out.GetTotal_bytes()}, nil
}

// ParamInfo describes a registered param.
type ParamInfo struct {
	Name                  string
	Shape                 []int64
	Unit, Group           int
	Numel                 uint64
	ParamDType, GradDType DType
}

// ParamInfo describes param id (any time after AddParam). Local.
func (e *Engine) ParamInfo(param int) (ParamInfo, error) {
	h, err := e.lock()
	if err != nil {
		return ParamInfo{}, err
	}
	defer e.mu.Unlock()
	if _, err := id32(param, "param"); err != nil {
		return ParamInfo{}, err
	}
	out := capi.NewZero_param_info_t()
	defer capi.DeleteZero_param_info_t(out)
	if err := call(func() error { return capi.Zero_param_info(out, h, param) }); err != nil {
		return ParamInfo{}, err
	}
	shape := make([]int64, out.GetNdim())
	for i := range shape {
		shape[i] = out.Dim(i)
	}
	return ParamInfo{Name: out.Param_name(), Shape: shape, Unit: out.GetUnit(), Group: out.GetGroup(),
		Numel: out.GetNumel(), ParamDType: DType(out.GetParam_dtype()), GradDType: DType(out.GetGrad_dtype())}, nil
}

// CommKindStats is one collective kind's traffic: calls, payload bytes as nccl-tests counts them, and the bytes one
// rank sends in a bandwidth-optimal algorithm.
type CommKindStats struct{ Calls, Bytes, WireBytes uint64 }

// CommStats is the engine's collective traffic since Finalize.
type CommStats struct {
	Sequence                                                uint64
	AllGather, ReduceScatter, AllReduce, Broadcast, Control CommKindStats
}

// CommStats reports the engine's collective traffic since Finalize.
func (e *Engine) CommStats() (CommStats, error) {
	h, err := e.lock()
	if err != nil {
		return CommStats{}, err
	}
	defer e.mu.Unlock()
	out := capi.NewZero_comm_stats_t()
	defer capi.DeleteZero_comm_stats_t(out)
	if err := call(func() error { return capi.Zero_comm_stats(out, h) }); err != nil {
		return CommStats{}, err
	}
	kind := func(k capi.Zero_comm_kind_stats_t) CommKindStats {
		return CommKindStats{Calls: k.GetCalls(), Bytes: k.GetBytes(), WireBytes: k.GetWire_bytes()}
	}
	return CommStats{Sequence: out.GetSequence(), AllGather: kind(out.GetAll_gather()),
		ReduceScatter: kind(out.GetReduce_scatter()), AllReduce: kind(out.GetAll_reduce()),
		Broadcast: kind(out.GetBroadcast()), Control: kind(out.GetControl())}, nil
}
