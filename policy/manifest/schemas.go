package manifest

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"sort"
	"strings"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	structuraldefaulting "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	structurallisttype "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/listtype"
	schemaobjectmeta "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/objectmeta"
	structuralpruning "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	metavalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"sigs.k8s.io/yaml"
)

// Schemas validates objects of the kinds of a set of CustomResourceDefinitions
// the way the API server does on create, with the API server's own
// libraries (k8s.io/apiextensions-apiserver): unknown fields are errors (as
// with kubectl's default strict field validation), defaults are applied,
// then the object metadata, the OpenAPI schema, embedded objects, list
// types and the x-kubernetes-validations CEL rules are checked.
type Schemas struct {
	byKind map[schema.GroupKind]*crdSchema
	groups map[string]bool
}

type crdSchema struct {
	gvk        schema.GroupVersionKind
	namespaced bool
	status     bool // has a status subresource: create drops status
	structural *structuralschema.Structural
	validator  validation.SchemaValidator
	cel        *cel.Validator
}

// LoadSchemas reads every .yaml file of fsys (api/crds.FS) as a
// CustomResourceDefinition and prepares its served version's schema.
func LoadSchemas(fsys fs.FS) (*Schemas, error) {
	s := &Schemas{byKind: map[schema.GroupKind]*crdSchema{}, groups: map[string]bool{}}
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || path.Ext(p) != ".yaml" {
			return err
		}
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.UnmarshalStrict(b, &crd); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		c, err := newCRDSchema(&crd)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		s.byKind[c.gvk.GroupKind()] = c
		s.groups[c.gvk.Group] = true
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(s.byKind) == 0 {
		return nil, errors.New("no CustomResourceDefinition found")
	}
	return s, nil
}

func newCRDSchema(crd *apiextensionsv1.CustomResourceDefinition) (*crdSchema, error) {
	var v *apiextensionsv1.CustomResourceDefinitionVersion
	for i := range crd.Spec.Versions {
		if crd.Spec.Versions[i].Served && crd.Spec.Versions[i].Storage {
			v = &crd.Spec.Versions[i]
		}
	}
	if v == nil || v.Schema == nil || v.Schema.OpenAPIV3Schema == nil {
		return nil, fmt.Errorf("CRD %s has no served storage version with a schema", crd.Name)
	}
	var internal apiextensions.JSONSchemaProps
	if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(v.Schema.OpenAPIV3Schema, &internal, nil); err != nil {
		return nil, err
	}
	structural, err := structuralschema.NewStructural(&internal)
	if err != nil {
		return nil, err
	}
	validator, _, err := validation.NewSchemaValidator(&internal)
	if err != nil {
		return nil, err
	}
	return &crdSchema{
		gvk:        schema.GroupVersionKind{Group: crd.Spec.Group, Version: v.Name, Kind: crd.Spec.Names.Kind},
		namespaced: crd.Spec.Scope == apiextensionsv1.NamespaceScoped,
		status:     v.Subresources != nil && v.Subresources.Status != nil,
		structural: structural,
		validator:  validator,
		cel:        cel.NewValidator(structural, true, celconfig.PerCallLimit),
	}, nil
}

// Kinds lists the kinds the schemas know, "group/version Kind", sorted.
func (s *Schemas) Kinds() []string {
	var out []string
	for _, c := range s.byKind {
		out = append(out, c.gvk.GroupVersion().String()+" "+c.gvk.Kind)
	}
	sort.Strings(out)
	return out
}

// ErrWrongAPIVersion means an object names a known kind with an apiVersion
// the CRD does not serve (or a known group with an unknown kind).
var ErrWrongAPIVersion = errors.New("wrong apiVersion")

// apiVersionError is an ErrWrongAPIVersion that says which apiVersion is
// expected.
type apiVersionError struct{ msg string }

func (e *apiVersionError) Error() string        { return e.msg }
func (e *apiVersionError) Is(target error) bool { return target == ErrWrongAPIVersion }

func wrongAPIVersion(format string, args ...any) error {
	return &apiVersionError{msg: fmt.Sprintf(format, args...)}
}

// expected returns the CRD schema for obj's apiVersion and kind. It returns
// nil and no error when obj is not of the schemas' groups or kinds, and
// ErrWrongAPIVersion (with the apiVersion that is expected) when the group,
// version or kind is near one of them but wrong.
func (s *Schemas) expected(gv schema.GroupVersion, kind string) (*crdSchema, error) {
	if c := s.byKind[schema.GroupKind{Group: gv.Group, Kind: kind}]; c != nil {
		if c.gvk.Version != gv.Version {
			return nil, wrongAPIVersion("Unsupported value: %q: %s is served as apiVersion %s", gv.String(), kind, c.gvk.GroupVersion())
		}
		return c, nil
	}
	var sameKind []string
	for _, c := range s.byKind {
		if c.gvk.Kind == kind {
			sameKind = append(sameKind, c.gvk.GroupVersion().String())
		}
	}
	ours := s.groups[gv.Group] || strings.Contains(gv.Group, "relaymesh") || gv.Group == ""
	switch {
	case len(sameKind) > 0 && ours:
		return nil, wrongAPIVersion("Unsupported value: %q: %s is served as apiVersion %s", gv.String(), kind, strings.Join(sameKind, ", "))
	case s.groups[gv.Group]:
		var kinds []string
		for gk := range s.byKind {
			if gk.Group == gv.Group {
				kinds = append(kinds, gk.Kind)
			}
		}
		slices.Sort(kinds)
		return nil, wrongAPIVersion("Unsupported value: %q: the group %s has no kind %s (it has %s)", gv.String(), gv.Group, kind, strings.Join(kinds, ", "))
	case strings.Contains(gv.Group, "relaymesh"):
		var groups []string
		for g := range s.groups {
			groups = append(groups, g)
		}
		slices.Sort(groups)
		return nil, wrongAPIVersion("Unsupported value: %q: Relaymesh's API groups are %s", gv.String(), strings.Join(groups, ", "))
	}
	return nil, nil
}

// celNotChecked is what the API server says when schema errors keep it from
// evaluating the CEL rules.
const celNotChecked = "some validation rules were not checked because the object was invalid; correct the existing errors to complete validation"

// admit prepares u as the API server does on create (drops status when the
// CRD has a status subresource, prunes unknown fields, applies defaults)
// and validates it. It returns the unknown fields it pruned (which strict
// field validation refuses) and every validation error with its field
// path (the CEL rules are not evaluated after a blocking schema error, as
// on the API server: the last error then says so, without a field). u is
// changed in place.
func (c *crdSchema) admit(ctx context.Context, u *unstructured.Unstructured) (unknown []string, errs field.ErrorList) {
	if c.status {
		delete(u.Object, "status")
	}
	kind, apiVersion := u.GetKind(), u.GetAPIVersion()
	meta, found, unknownMeta, err := schemaobjectmeta.GetObjectMetaWithOptions(u.Object, schemaobjectmeta.ObjectMetaOptions{ReturnUnknownFieldPaths: true})
	if err != nil {
		return nil, field.ErrorList{field.Invalid(field.NewPath("metadata"), nil, err.Error())}
	}
	unknown = append(unknown, unknownMeta...)
	unknown = append(unknown, structuralpruning.PruneWithOptions(u.Object, c.structural, true, structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true})...)
	structuraldefaulting.PruneNonNullableNullsWithoutDefaults(u.Object, c.structural)
	if ferr, paths := schemaobjectmeta.CoerceWithOptions(nil, u.Object, c.structural, false, schemaobjectmeta.CoerceOptions{ReturnUnknownFieldPaths: true}); ferr != nil {
		errs = append(errs, ferr)
	} else {
		unknown = append(unknown, paths...)
	}
	u.SetKind(kind)
	u.SetAPIVersion(apiVersion)
	if found {
		if err := schemaobjectmeta.SetObjectMeta(u.Object, meta); err != nil {
			errs = append(errs, field.Invalid(field.NewPath("metadata"), nil, err.Error()))
		}
	}
	slices.Sort(unknown)
	unknown = slices.Compact(unknown)
	structuraldefaulting.Default(u.Object, c.structural)

	errs = append(errs, metavalidation.ValidateObjectMetaAccessor(u, c.namespaced, metavalidation.NameIsDNSSubdomain, field.NewPath("metadata"))...)
	errs = append(errs, validation.ValidateCustomResource(nil, u.Object, c.validator)...)
	errs = append(errs, schemaobjectmeta.Validate(nil, u.Object, c.structural, false)...)
	errs = append(errs, structurallisttype.ValidateListSetsAndMaps(nil, c.structural, u.Object)...)
	if blocking(errs) {
		// As the API server: CEL rules assume the schema holds.
		return unknown, append(errs, &field.Error{Type: field.ErrorTypeInternal, Detail: celNotChecked})
	}
	celErrs, _ := c.cel.Validate(ctx, nil, c.structural, u.Object, nil, celconfig.RuntimeCELCostBudget)
	return unknown, append(errs, celErrs...)
}

// blocking is the API server's hasBlockingErr: errors after which CEL rules
// are not evaluated.
func blocking(errs field.ErrorList) bool {
	for _, err := range errs {
		switch err.Type {
		case field.ErrorTypeNotSupported, field.ErrorTypeRequired, field.ErrorTypeTooLong, field.ErrorTypeTooMany, field.ErrorTypeTypeInvalid:
			return true
		}
	}
	return false
}
