package main

// The CK8sConfig API type, modelled on the provider's bootstrap/api/v1beta2/ck8sconfig_types.go
// (canonical/cluster-api-k8s) so that the informer cache holds objects of the same shape and
// size as the provider's. The provider's module is not available to this build, so the type is
// written here, with hand-written deep-copy functions (the cache deep-copies on every Get, as
// the provider's generated ones do).

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clusterv1beta1 "sigs.k8s.io/cluster-api/api/core/v1beta1"
)

// ck8sGroupVersion is the CK8sConfig API group and version the provider registers.
var ck8sGroupVersion = schema.GroupVersion{Group: "bootstrap.cluster.x-k8s.io", Version: "v1beta2"}

// Annotations the provider's Machine controllers read (bootstrap/api/v1beta2/*_consts.go).
const (
	certificatesRefreshAnnotation       = "v1beta2.k8sd.io/refresh-certificates"
	certificatesRefreshStatusAnnotation = "v1beta2.k8sd.io/refresh-certificates-status"
	certificatesRefreshInProgress       = "in-progress"
	certificatesExpiryAnnotation        = "machine.cluster.x-k8s.io/certificates-expiry"

	inPlaceUpgradeToAnnotation      = "v1beta2.k8sd.io/in-place-upgrade-to"
	inPlaceUpgradeReleaseAnnotation = "v1beta2.k8sd.io/in-place-upgrade-release"

	// Condition types of the CK8sConfig (bootstrap/api/v1beta2/condition_consts.go).
	dataSecretAvailableCondition   clusterv1beta1.ConditionType = "DataSecretAvailable"
	certificatesAvailableCondition clusterv1beta1.ConditionType = "CertificatesAvailable"
	waitingForClusterInfraReason                                = "WaitingForClusterInfrastructure"
)

// CK8sConfig is the bootstrap configuration of one Machine.
type CK8sConfig struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   CK8sConfigSpec   `json:"spec,omitempty"`
	Status CK8sConfigStatus `json:"status,omitempty"`
}

// CK8sConfigList is a list of CK8sConfigs.
type CK8sConfigList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []CK8sConfig `json:"items"`
}

// CK8sConfigSpec has the fields of the provider's spec.
type CK8sConfigSpec struct {
	Version                    string                 `json:"version,omitempty"`
	Files                      []File                 `json:"files,omitempty"`
	BootstrapConfig            *BootstrapConfig       `json:"bootstrapConfig,omitempty"`
	BootCommands               []string               `json:"bootCommands,omitempty"`
	PreRunCommands             []string               `json:"preRunCommands,omitempty"`
	AdditionalUserData         map[string]string      `json:"additionalUserData,omitempty"`
	PostRunCommands            []string               `json:"postRunCommands,omitempty"`
	AirGapped                  bool                   `json:"airGapped,omitempty"`
	SnapstoreProxyScheme       string                 `json:"snapstoreProxyScheme,omitempty"`
	SnapstoreProxyDomain       string                 `json:"snapstoreProxyDomain,omitempty"`
	SnapstoreProxyID           string                 `json:"snapstoreProxyId,omitempty"`
	HTTPSProxy                 string                 `json:"httpsProxy,omitempty"`
	HTTPProxy                  string                 `json:"httpProxy,omitempty"`
	NoProxy                    string                 `json:"noProxy,omitempty"`
	Channel                    string                 `json:"channel,omitempty"`
	Revision                   string                 `json:"revision,omitempty"`
	LocalPath                  string                 `json:"localPath,omitempty"`
	ControlPlaneConfig         CK8sControlPlaneConfig `json:"controlPlane,omitempty"`
	InitConfig                 CK8sInitConfiguration  `json:"initConfig,omitempty"`
	NodeName                   string                 `json:"nodeName,omitempty"`
	ExtraKubeProxyArgs         map[string]*string     `json:"extraKubeProxyArgs,omitempty"`
	ExtraKubeletArgs           map[string]*string     `json:"extraKubeletArgs,omitempty"`
	ExtraContainerdArgs        map[string]*string     `json:"extraContainerdArgs,omitempty"`
	ExtraK8sAPIServerProxyArgs map[string]*string     `json:"ExtraK8sAPIServerProxyArgs,omitempty"`
}

// CK8sControlPlaneConfig is spec.controlPlane.
type CK8sControlPlaneConfig struct {
	ExtraSANs                      []string           `json:"extraSANs,omitempty"`
	CloudProvider                  string             `json:"cloudProvider,omitempty"`
	NodeTaints                     []string           `json:"nodeTaints,omitempty"`
	DatastoreType                  string             `json:"datastoreType,omitempty"`
	DatastoreServersSecretRef      SecretRef          `json:"datastoreServersSecretRef,omitempty"`
	EtcdPort                       int                `json:"etcdPort,omitempty"`
	EtcdPeerPort                   int                `json:"etcdPeerPort,omitempty"`
	MicroclusterAddress            string             `json:"microclusterAddress,omitempty"`
	MicroclusterPort               *int               `json:"microclusterPort,omitempty"`
	ExtraKubeAPIServerArgs         map[string]*string `json:"extraKubeAPIServerArgs,omitempty"`
	ExtraKubeControllerManagerArgs map[string]*string `json:"extraKubeControllerManagerArgs,omitempty"`
	ExtraKubeSchedulerArgs         map[string]*string `json:"extraKubeSchedulerArgs,omitempty"`
}

// CK8sInitConfiguration is spec.initConfig.
type CK8sInitConfiguration struct {
	Annotations                map[string]string `json:"annotations,omitempty"`
	EnableDefaultDNS           *bool             `json:"enableDefaultDNS,omitempty"`
	EnableDefaultLoadBalancer  *bool             `json:"enableDefaultLoadBalancer,omitempty"`
	EnableDefaultGateway       *bool             `json:"enableDefaultGateway,omitempty"`
	EnableDefaultIngress       *bool             `json:"enableDefaultIngress,omitempty"`
	EnableDefaultLocalStorage  *bool             `json:"enableDefaultLocalStorage,omitempty"`
	EnableDefaultMetricsServer *bool             `json:"enableDefaultMetricsServer,omitempty"`
	EnableDefaultNetwork       *bool             `json:"enableDefaultNetwork,omitempty"`
}

// CK8sConfigStatus keeps the provider's v1beta1-style conditions.
type CK8sConfigStatus struct {
	Ready              bool                      `json:"ready,omitempty"`
	BootstrapData      []byte                    `json:"bootstrapData,omitempty"`
	DataSecretName     *string                   `json:"dataSecretName,omitempty"`
	FailureReason      string                    `json:"failureReason,omitempty"`
	FailureMessage     string                    `json:"failureMessage,omitempty"`
	ObservedGeneration int64                     `json:"observedGeneration,omitempty"`
	Conditions         clusterv1beta1.Conditions `json:"conditions,omitempty"`
}

// Encoding of a file's content.
type Encoding string

// BootstrapConfig is spec.bootstrapConfig.
type BootstrapConfig struct {
	Content     string      `json:"content,omitempty"`
	ContentFrom *FileSource `json:"contentFrom,omitempty"`
}

// File is one entry of spec.files.
type File struct {
	Path        string      `json:"path"`
	Owner       string      `json:"owner,omitempty"`
	Permissions string      `json:"permissions,omitempty"`
	Encoding    Encoding    `json:"encoding,omitempty"`
	Content     string      `json:"content,omitempty"`
	ContentFrom *FileSource `json:"contentFrom,omitempty"`
}

// FileSource points at a Secret key.
type FileSource struct {
	Secret SecretFileSource `json:"secret"`
}

// SecretFileSource names a Secret key.
type SecretFileSource struct {
	Name string `json:"name"`
	Key  string `json:"key"`
}

// SecretRef names a Secret key.
type SecretRef struct {
	Name string `json:"name"`
	Key  string `json:"key,omitempty"`
}

// addCK8sToScheme registers CK8sConfig and CK8sConfigList under bootstrap.cluster.x-k8s.io/v1beta2.
func addCK8sToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(ck8sGroupVersion, &CK8sConfig{}, &CK8sConfigList{})
	metav1.AddToGroupVersion(s, ck8sGroupVersion)
	return nil
}

// --- deep copy ---

func copyStringPtrMap(in map[string]*string) map[string]*string {
	if in == nil {
		return nil
	}
	out := make(map[string]*string, len(in))
	for k, v := range in {
		if v == nil {
			out[k] = nil
			continue
		}
		s := *v
		out[k] = &s
	}
	return out
}

func copyStringMap(in map[string]string) map[string]string {
	if in == nil {
		return nil
	}
	out := make(map[string]string, len(in))
	for k, v := range in {
		out[k] = v
	}
	return out
}

func copyStrings(in []string) []string {
	if in == nil {
		return nil
	}
	return append(make([]string, 0, len(in)), in...)
}

func copyBoolPtr(in *bool) *bool {
	if in == nil {
		return nil
	}
	b := *in
	return &b
}

func copyFileSource(in *FileSource) *FileSource {
	if in == nil {
		return nil
	}
	out := *in
	return &out
}

// DeepCopyInto copies the receiver into out.
func (in *CK8sControlPlaneConfig) DeepCopyInto(out *CK8sControlPlaneConfig) {
	*out = *in
	out.ExtraSANs = copyStrings(in.ExtraSANs)
	out.NodeTaints = copyStrings(in.NodeTaints)
	if in.MicroclusterPort != nil {
		p := *in.MicroclusterPort
		out.MicroclusterPort = &p
	}
	out.ExtraKubeAPIServerArgs = copyStringPtrMap(in.ExtraKubeAPIServerArgs)
	out.ExtraKubeControllerManagerArgs = copyStringPtrMap(in.ExtraKubeControllerManagerArgs)
	out.ExtraKubeSchedulerArgs = copyStringPtrMap(in.ExtraKubeSchedulerArgs)
}

// DeepCopyInto copies the receiver into out.
func (in *CK8sInitConfiguration) DeepCopyInto(out *CK8sInitConfiguration) {
	*out = *in
	out.Annotations = copyStringMap(in.Annotations)
	out.EnableDefaultDNS = copyBoolPtr(in.EnableDefaultDNS)
	out.EnableDefaultLoadBalancer = copyBoolPtr(in.EnableDefaultLoadBalancer)
	out.EnableDefaultGateway = copyBoolPtr(in.EnableDefaultGateway)
	out.EnableDefaultIngress = copyBoolPtr(in.EnableDefaultIngress)
	out.EnableDefaultLocalStorage = copyBoolPtr(in.EnableDefaultLocalStorage)
	out.EnableDefaultMetricsServer = copyBoolPtr(in.EnableDefaultMetricsServer)
	out.EnableDefaultNetwork = copyBoolPtr(in.EnableDefaultNetwork)
}

// DeepCopyInto copies the receiver into out.
func (in *CK8sConfigSpec) DeepCopyInto(out *CK8sConfigSpec) {
	*out = *in
	if in.Files != nil {
		out.Files = make([]File, len(in.Files))
		for i := range in.Files {
			out.Files[i] = in.Files[i]
			out.Files[i].ContentFrom = copyFileSource(in.Files[i].ContentFrom)
		}
	}
	if in.BootstrapConfig != nil {
		bc := *in.BootstrapConfig
		bc.ContentFrom = copyFileSource(in.BootstrapConfig.ContentFrom)
		out.BootstrapConfig = &bc
	}
	out.BootCommands = copyStrings(in.BootCommands)
	out.PreRunCommands = copyStrings(in.PreRunCommands)
	out.AdditionalUserData = copyStringMap(in.AdditionalUserData)
	out.PostRunCommands = copyStrings(in.PostRunCommands)
	in.ControlPlaneConfig.DeepCopyInto(&out.ControlPlaneConfig)
	in.InitConfig.DeepCopyInto(&out.InitConfig)
	out.ExtraKubeProxyArgs = copyStringPtrMap(in.ExtraKubeProxyArgs)
	out.ExtraKubeletArgs = copyStringPtrMap(in.ExtraKubeletArgs)
	out.ExtraContainerdArgs = copyStringPtrMap(in.ExtraContainerdArgs)
	out.ExtraK8sAPIServerProxyArgs = copyStringPtrMap(in.ExtraK8sAPIServerProxyArgs)
}

// DeepCopyInto copies the receiver into out.
func (in *CK8sConfigStatus) DeepCopyInto(out *CK8sConfigStatus) {
	*out = *in
	if in.BootstrapData != nil {
		out.BootstrapData = append([]byte(nil), in.BootstrapData...)
	}
	if in.DataSecretName != nil {
		s := *in.DataSecretName
		out.DataSecretName = &s
	}
	if in.Conditions != nil {
		out.Conditions = make(clusterv1beta1.Conditions, len(in.Conditions))
		for i := range in.Conditions {
			in.Conditions[i].DeepCopyInto(&out.Conditions[i])
		}
	}
}

// DeepCopyInto copies the receiver into out.
func (in *CK8sConfig) DeepCopyInto(out *CK8sConfig) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	in.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	in.Spec.DeepCopyInto(&out.Spec)
	in.Status.DeepCopyInto(&out.Status)
}

// DeepCopy returns a deep copy.
func (in *CK8sConfig) DeepCopy() *CK8sConfig { return deepCopy(in) }

// DeepCopyObject implements runtime.Object.
func (in *CK8sConfig) DeepCopyObject() runtime.Object { return deepCopyObject(in) }

// DeepCopyInto copies the receiver into out.
func (in *CK8sConfigList) DeepCopyInto(out *CK8sConfigList) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	in.ListMeta.DeepCopyInto(&out.ListMeta)
	if in.Items != nil {
		out.Items = make([]CK8sConfig, len(in.Items))
		for i := range in.Items {
			in.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
}

// DeepCopy returns a deep copy.
func (in *CK8sConfigList) DeepCopy() *CK8sConfigList { return deepCopy(in) }

// DeepCopyObject implements runtime.Object.
func (in *CK8sConfigList) DeepCopyObject() runtime.Object { return deepCopyObject(in) }

// deepCopy is the generated DeepCopy of a pointer type with a DeepCopyInto: nil stays nil.
func deepCopy[T any, P interface {
	*T
	DeepCopyInto(*T)
}](in P) P {
	if in == nil {
		return nil
	}
	out := P(new(T))
	in.DeepCopyInto(out)
	return out
}

// deepCopyObject is the generated DeepCopyObject: a nil receiver gives a nil interface, not a
// typed nil pointer inside one.
func deepCopyObject[T any, P interface {
	*T
	DeepCopyInto(*T)
	runtime.Object
}](in P) runtime.Object {
	if in == nil {
		return nil
	}
	return deepCopy[T, P](in)
}
